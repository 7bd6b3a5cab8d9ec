/* cmd_claim_batch.c: EMQ.CLAIM's second form (3 args), the twin of claim_batch.lua. KEYS
 * meta, ring, active; ARGV base, lease_ms, n. */
#include "lease.h"
#include "commands.gen.h"

/* claim_batch.lua: {{id, payload, attempts, group|nil[, floor]}, ...} | {ms}. */
void emq_cmd_claim_batch(emq *e) {
    long long lease = emq_need_ll(e, emq_arg(e, 2));
    long long n = emq_need_ll(e, emq_arg(e, 3));
    emq_lease out;
    emq_lease_init(&out);
    if (emq_claim_gate(e, &out)) {
        RedisModule_ReplyWithArray(e->ctx, 0);
        return;
    }
    long long now = emq_now_ms(e);
    emq_claim_n(e, emq_deadline_of(e, now, lease), n, &out, now);
    if (out.n == 0) {
        long long wait = emq_rate_wait_in(e, now, &out);
        if (wait > 0) {
            RedisModule_ReplyWithArray(e->ctx, 1);
            RedisModule_ReplyWithLongLong(e->ctx, wait);
            return;
        }
    }
    RedisModule_ReplyWithArray(e->ctx, out.n);
    for (long long i = 0; i < out.n; i++) emq_reply_job(e, &out.jobs[i]);
}
