/* cmd_extend.c: EMQ.EXTEND's first form, the twin of extend.lua (2 keys). */
#include "emq.h"
#include "commands.gen.h"

/* extend.lua: KEYS active, row; ARGV base id token lease_ms. */
void emq_cmd_extend(emq *e) {
    /* Checked first, as the Lua's prologue does (include/args.lua, PROTOCOL §6). */
    long long lease = emq_need_ll(e, emq_arg(e, 4));
    emq_sv id = emq_arg(e, 2), jk = emq_key_at(e, 2);
    emq_sv row[EMQ_ROW];
    const char *err;
    int f = emq_fence(e, jk, emq_arg(e, 3), "extend", 0, row, &err);
    if (f == EMQ_FENCE_STALE) {
        RedisModule_ReplyWithError(e->ctx, err);
        return;
    }
    if (f == EMQ_FENCE_GONE) {
        RedisModule_ReplyWithLongLong(e->ctx, 0);
        return;
    }
    emq_rearm(e, id, jk, row, emq_now_ms(e) + lease);
    RedisModule_ReplyWithLongLong(e->ctx, 1);
}
