/* cmd_claim.c: EMQ.CLAIM's first form (2 args), the twin of claim.lua. KEYS meta, ring,
 * active; ARGV base, lease_ms. */
#include "lease.h"
#include "commands.gen.h"

/* claim.lua: {id, payload, attempts, group|nil[, floor]} | {} | {ms}. */
void emq_cmd_claim(emq *e) {
    /* Before anything is read, as the Lua's prologue checks it (include/args.lua). */
    long long lease = emq_need_ll(e, emq_arg(e, 2));
    emq_lease out;
    emq_lease_init(&out);
    if (emq_claim_gate(e, &out)) {
        RedisModule_ReplyWithArray(e->ctx, 0);
        return;
    }
    long long now = emq_now_ms(e);
    emq_claim_n(e, emq_deadline_of(e, now, lease), 1, &out, now);
    if (out.n > 0) {
        emq_reply_job(e, &out.jobs[0]);
        return;
    }
    long long wait = emq_rate_wait_in(e, now, &out);
    if (wait > 0) {
        RedisModule_ReplyWithArray(e->ctx, 1);
        RedisModule_ReplyWithLongLong(e->ctx, wait);
        return;
    }
    RedisModule_ReplyWithArray(e->ctx, 0);
}
