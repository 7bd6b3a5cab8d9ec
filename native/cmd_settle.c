/* cmd_settle.c: EMQ.SETTLE, the twin of settle.lua (the worker's round trip): completes (some
 * keeping their results, D17), retries (a dead-letter may keep its error), then a claim of n
 * on one lease. KEYS meta, ring, active, schedule, dead; ARGV base, lease_ms, n, completes
 * ('c' or 'c:r'), then c (id, token) pairs, r (result, keep_result_ms) pairs, and 5 args per
 * retry (id, token, delay_ms, max_attempts['max:keep_ms'], error).
 *
 * Every argument is parsed and checked before the first write (the gate's HMGET of meta is a
 * read), so a malformed call is an ERR that changed nothing; the Lua would raise midway. */
#include <limits.h>
#include <string.h>

#include "lease.h"
#include "settle.h"
#include "commands.gen.h"

#define ERR_NUM "ERR a numeric argument is not an integer"

/* Lua '^(%d+):?(%d*)$' (digits, an optional ':', optional digits): *a gets the first number,
 * *b the second or -1 when it is empty (the Lua's nil). A number too big for 64 bits is
 * refused like any malformed number. */
static int digits_pair(emq_sv s, long long *a, long long *b) {
    size_t i = 0;
    *a = 0;
    *b = -1;
    if (!s.p) return 0;
    /* At most 15 digits a number, as every numeric argument (include/args.lua count_pair). */
    size_t first = 0;
    while (first < s.n && s.p[first] >= '0' && s.p[first] <= '9') first++;
    if (first > 15) return 0;
    if (first < s.n && s.p[first] == ':' && s.n - first - 1 > 15) return 0;
    while (i < s.n && s.p[i] >= '0' && s.p[i] <= '9') {
        if (__builtin_mul_overflow(*a, 10, a) || __builtin_add_overflow(*a, s.p[i] - '0', a))
            return 0;
        i++;
    }
    if (i == 0) return 0;
    if (i < s.n && s.p[i] == ':') i++;
    if (i < s.n) {
        *b = 0;
        for (; i < s.n; i++) {
            if (s.p[i] < '0' || s.p[i] > '9') return 0;
            if (__builtin_mul_overflow(*b, 10, b) || __builtin_add_overflow(*b, s.p[i] - '0', b))
                return 0;
        }
    }
    return 1;
}

/* One retry, parsed ahead of the writes. */
typedef struct {
    emq_sv id, token, error;
    long long delay, max, keep;
} settle_retry;

static void reply_verdict(emq *e, emq_verdict v) {
    /* The batch returns an EMQSTALE text in place, as a plain string (a Lua table element). */
    if (v.text)
        RedisModule_ReplyWithStringBuffer(e->ctx, v.text, strlen(v.text));
    else
        RedisModule_ReplyWithLongLong(e->ctx, v.n);
}

void emq_cmd_settle(emq *e) {
    emq_lease out;
    emq_lease_init(&out);
    /* One read of meta first: the pause flag for the claim part and the events bound every
     * completion's emit would otherwise read (claim_gate). */
    int paused = emq_claim_gate(e, &out);

    /* ---- parse everything before the first write: lease_ms and n first, as the Lua's
     * prologue does (include/args.lua) ---- */
    long long lease = emq_need_ll(e, emq_arg(e, 2));
    long long n = emq_need_ll(e, emq_arg(e, 3));
    long long nc, nr;
    if (!digits_pair(emq_arg(e, 4), &nc, &nr))
        emq_fail(e, "ERR EMQ.SETTLE completes must be 'c' or 'c:r' (decimal counts)");
    if (nr < 0) nr = 0;
    long long tail = (long long)e->nargs - 4;
    /* nr > nc would make the Lua read its kept results from before the pairs (nonsense); the
     * counts must also fit the args given, with whole 5-arg retries after them. */
    if (nr > nc || nc > tail / 2 || 2 * nc + 2 * nr > tail || (tail - 2 * nc - 2 * nr) % 5 != 0)
        emq_fail(e, "ERR EMQ.SETTLE args do not fit: c (id, token) pairs, r (result, "
                    "keep_result_ms) pairs, then 5 args per retry");
    int c = (int)nc, r = (int)nr;
    int nretry = (int)((tail - 2 * nc - 2 * nr) / 5);
    const emq_sv *pairs = e->args + 4;
    const emq_sv *kept = pairs + 2 * c;
    emq_sv *res_ids = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(r + 1));
    emq_sv *res_vals = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(r + 1));
    long long *keep_ms = RedisModule_PoolAlloc(e->ctx, sizeof(long long) * (size_t)(r + 1));
    for (int j = 0; j < r; j++) {
        res_ids[j] = pairs[2 * (c - r + j)];
        res_vals[j] = kept[2 * j];
        keep_ms[j] = emq_need_ll(e, kept[2 * j + 1]);
    }
    long long now = emq_now_ms(e);
    settle_retry *rt = RedisModule_PoolAlloc(e->ctx, sizeof(settle_retry) * (size_t)(nretry + 1));
    const emq_sv *ra = kept + 2 * r;
    for (int k = 0; k < nretry; k++, ra += 5) {
        rt[k].id = ra[0];
        rt[k].token = ra[1];
        rt[k].delay = emq_need_ll(e, ra[2]);
        long long ignored;
        /* now + delay_ms is the schedule score: one that overflows is malformed input. */
        if (__builtin_add_overflow(now, rt[k].delay, &ignored)) emq_fail(e, ERR_NUM);
        if (!digits_pair(ra[3], &rt[k].max, &rt[k].keep)) emq_fail(e, ERR_NUM);
        if (rt[k].keep < 0) rt[k].keep = 0; /* 'max:' or 'max': no kept error */
        rt[k].error = ra[4];
    }
    long long deadline = 0;
    int claims = n > 0 && !paused;
    if (claims && __builtin_add_overflow(now, lease, &deadline)) emq_fail(e, ERR_NUM);

    /* ---- the writes, in the Lua's order ---- */
    emq_verdict *completed = RedisModule_PoolAlloc(e->ctx, sizeof(emq_verdict) * (size_t)(c + 1));
    emq_keep history; /* kept history: claim_gate read meta keep_completed (history.h) */
    emq_keep_parse(e->keep_completed, &history);
    emq_complete_many(e, pairs, c, res_ids, res_vals, r, now, &history, completed);
    for (int j = 0; j < r; j++) {
        int at = c - r + j;
        /* The attempts a kept result records is the settling token. */
        if (!completed[at].text && completed[at].n == 1)
            emq_keep_outcome(e, pairs[2 * at], "result", res_vals[j], pairs[2 * at + 1],
                             keep_ms[j], now);
    }
    emq_verdict *retried =
        RedisModule_PoolAlloc(e->ctx, sizeof(emq_verdict) * (size_t)(nretry + 1));
    for (int k = 0; k < nretry; k++)
        retried[k] = emq_retry_one(e, rt[k].id, emq_key2(e, EMQ_KP_JOB, rt[k].id), rt[k].token,
                                   rt[k].delay, rt[k].max, rt[k].error, now, rt[k].keep);
    emq_trim_dead(e, now); /* keep_dead, after this call's dead-letters (history.h) */
    long long wait = 0;
    if (claims) {
        emq_claim_n(e, deadline, n, &out, now);
        if (out.n == 0) wait = emq_rate_wait_in(e, now, &out);
    }

    /* settle.lua (issue 41): held = 1 when a claim was asked and the queue-wide limit leaves
     * no room after it while work waits: the worker then claims with the settles that free
     * room. */
    long long held = 0;
    if (claims && out.qlimited) {
        long long room =
            out.qlimit - emq_card(e, emq_key(e, EMQ_K_ACTIVE), REDISMODULE_KEYTYPE_ZSET);
        if (room <= 0 && emq_int(e, emq_call(e, "SCARD", 1, emq_key(e, EMQ_K_INRING))) > 0)
            held = 1;
    }

    /* settle.lua (issue 37): under a queue-wide limit, wake a parked claimer for each slot
     * the settles freed that is still open while work waits, so the room is taken now and
     * not at the next beat. */
    if (!paused) {
        if (out.qlimited) { /* claim_gate read meta limit */
            long long freed = 0;
            for (int j = 0; j < c; j++)
                if (!completed[j].text && completed[j].n == 1) freed++;
            for (int k = 0; k < nretry; k++) {
                const char *t = retried[k].text;
                if (t && (!strcmp(t, "scheduled") || !strcmp(t, "dead") || !strcmp(t, "removed")))
                    freed++;
            }
            if (freed > 0) {
                long long room = out.qlimit - emq_card(e, emq_key(e, EMQ_K_ACTIVE),
                                                       REDISMODULE_KEYTYPE_ZSET);
                if (room > 0 && emq_int(e, emq_call(e, "SCARD", 1, emq_key(e, EMQ_K_INRING))) > 0)
                    emq_wake(e, freed < room ? freed : room);
            }
        }
    }

    /* ---- {completed, retried, jobs, wait, held} ---- */
    RedisModule_ReplyWithArray(e->ctx, 5);
    RedisModule_ReplyWithArray(e->ctx, c);
    for (int j = 0; j < c; j++) reply_verdict(e, completed[j]);
    RedisModule_ReplyWithArray(e->ctx, nretry);
    for (int k = 0; k < nretry; k++) reply_verdict(e, retried[k]);
    RedisModule_ReplyWithArray(e->ctx, out.n);
    for (long long j = 0; j < out.n; j++) emq_reply_job(e, &out.jobs[j]);
    RedisModule_ReplyWithLongLong(e->ctx, wait);
    RedisModule_ReplyWithLongLong(e->ctx, held);
}
