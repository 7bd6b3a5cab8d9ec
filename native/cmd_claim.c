/* cmd_claim.c: EMQ.CLAIM, the twin of claim.lua (3 keys, 2 args) and claim_batch.lua
 * (3 keys, 3 args). KEYS meta, ring, active; ARGV base, lease_ms[, n]. */
#include "lease.h"
#include "commands.gen.h"

/* The deadline now + lease_ms; an integer that would overflow is malformed input (the Lua
 * would score a float), refused like any other malformed number, before any write. */
static long long deadline_of(emq *e, long long now, long long lease) {
    long long d;
    if (__builtin_add_overflow(now, lease, &d))
        emq_fail(e, "ERR a numeric argument is not an integer");
    return d;
}

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
    emq_claim_n(e, deadline_of(e, now, lease), 1, &out, now);
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
    emq_claim_n(e, deadline_of(e, now, lease), n, &out, now);
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
