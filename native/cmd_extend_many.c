/* cmd_extend_many.c: EMQ.EXTEND's second form, the twin of extend_many.lua (1 key). */
#include "emq.h"
#include "commands.gen.h"

/* extend_many.lua: KEYS active; ARGV base lease_ms id token id token ... A missing last
 * token never matches (the Lua compares against nil): that id fails. */
void emq_cmd_extend_many(emq *e) {
    long long deadline = emq_now_ms(e) + emq_need_ll(e, emq_arg(e, 2));
    int pairs = (e->nargs - 1) / 2;
    emq_sv *failed = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(pairs + 1));
    emq_sv *flagged = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(pairs + 1));
    int nf = 0, ng = 0;
    for (int i = 3; i <= e->nargs; i += 2) {
        emq_sv id = emq_arg(e, i), token = emq_arg(e, i + 1);
        emq_sv jk = emq_key2(e, EMQ_KP_JOB, id);
        emq_sv row[EMQ_ROW];
        const char *err;
        int f = token.p ? emq_fence(e, jk, token, "extend", 0, row, &err) : EMQ_FENCE_STALE;
        if (f == EMQ_FENCE_OK) {
            emq_rearm(e, id, jk, row, deadline);
            if (emq_cancel_flagged(e, jk)) flagged[ng++] = emq_cat(e, 2, EMQ_LIT("!"), id);
        } else {
            failed[nf++] = id;
        }
    }
    RedisModule_ReplyWithArray(e->ctx, nf + ng);
    for (int i = 0; i < nf; i++) emq_reply_sv(e, failed[i]);
    for (int i = 0; i < ng; i++) emq_reply_sv(e, flagged[i]);
}
