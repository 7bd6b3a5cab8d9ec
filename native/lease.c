/* lease.c: the claim core (see lease.h), the twin of include/lease.lua; its claim gate
 * (common.lua) is in common.c and the queue-wide rate and concurrency limits (ratelimit.lua)
 * in ratelimit.c. Each function names the Lua one it mirrors and issues the same commands in
 * the same order. */
#include "lease.h"

#include "compose.h"
#include "history.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void emq_lease_init(emq_lease *out) { memset(out, 0, sizeof(*out)); }

static void push_job(emq *e, emq_lease *out, emq_job j) {
    if (out->n == out->cap) {
        long long cap = out->cap ? out->cap * 2 : 16;
        emq_job *grown = RedisModule_PoolAlloc(e->ctx, sizeof(emq_job) * (size_t)cap);
        if (out->n) memcpy(grown, out->jobs, sizeof(emq_job) * (size_t)out->n);
        out->jobs = grown;
        out->cap = cap;
    }
    out->jobs[out->n++] = j;
}

/* ------------------------------------------------------------------ lease.lua */

/* integer_text: a token a client can hold, at most 15 decimal digits. */
static int integer_text(emq_sv s) { return s.p && s.n <= 15 && emq_is_digits(s); }

/* branded (D2): 3 uppercase letters and 11 base62 digits, at most BRAND_MAX; compared byte by
 * byte, as the Lua does (ASCII: digits < upper < lower, the base62 order). */
static int branded(emq_sv id) {
    static const char BRAND_MAX[] = "AzL8n0Y58m7";
    if (id.n != 14) return 0;
    for (int i = 0; i < 3; i++)
        if (id.p[i] < 'A' || id.p[i] > 'Z') return 0;
    for (int i = 3; i < 14; i++) {
        char c = id.p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')))
            return 0;
    }
    unsigned char first = (unsigned char)id.p[3];
    if (first != 'A') return first < 'A';
    for (int i = 1; i < 11; i++) {
        unsigned char a = (unsigned char)id.p[3 + i], b = (unsigned char)BRAND_MAX[i];
        if (a != b) return a < b;
    }
    return 1;
}

/* redis.log(redis.LOG_WARNING, ...): RedisModule_Log is looked up per use, since rmapi.h
 * (shared, not ours) does not carry it and the module keeps no globals. */
typedef void (*log_fn)(RedisModuleCtx *ctx, const char *level, const char *fmt, ...);

static void log_dropped(emq *e, emq_sv id, emq_sv wk) {
    log_fn lg = NULL;
    if (RedisModule_GetApi("RedisModule_Log", (void *)&lg) != 0 || !lg) return;
    lg(e->ctx, "warning", "echomq: dropped %.*s from %.*s: not a hash", (int)id.n, id.p,
       (int)wk.n, wk.p);
}

/* ---- issue 24, expiry: lease.lua expire_job, a job past its `expires` dead-lettered. */
static void expire_job(emq *e, emq_sv id, emq_sv jk, emq_sv lane, emq_sv attempts,
                       long long now) {
    emq_sv why = EMQ_LIT("expired");
    emq_hset(e, 5, jk, EMQ_LIT("state"), EMQ_LIT("dead"), EMQ_LIT("last_error"), why);
    emq_dead_letter(e, id, now); /* counted for the claim's trim_dead (keep_dead, history.h) */
    emq_bump_metrics(e, "failed", 1, now);
    emq_sv extra[2] = {EMQ_LIT("error"), why};
    emq_emit_in(e, "dead", id, lane, 2, extra);
    emq_release_dedup(e, id, jk);
    emq_flow flow;
    if (emq_flow_parent(e, jk, &flow)) emq_flow_child_dead(e, id, &flow, why);
    emq_keep_death(e, id, why, attempts, 0, now);
}

/* expires (issue 24): Lua `now > (tonumber(expires) or now)`; no field or no number: live. */
static int expired(emq_sv expires, long long now) {
    long long at;
    return expires.p && emq_parse_ll(expires, &at) && now > at;
}
/* ---- end issue 24, expiry */

static const char F_ATTEMPTS[] = "attempts", F_STATE[] = "state", V_ACTIVE[] = "active",
                  F_EPOCH[] = "lease_epoch", F_CLAIMED[] = "claimed_ms";

/* lease_many: lease up to k of the oldest jobs of waiting set g (a lane or "*"). */
static long long lease_many(emq *e, emq_sv g, long long deadline, long long k, emq_lease *out,
                            long long now) {
    static const char *fields[4] = {"payload", "attempts", "floor", "expires"};
    emq_sv wk = emq_waiting_key(e, g);
    emq_sv lane = emq_eqs(g, "*") ? EMQ_NONE : g;
    emq_sv dl = emq_fmt_ll(e, deadline);
    long long got = 0;
    /* ZADD active's arguments, filled as the Lua fills `scored`. */
    emq_sv *scored = NULL;
    long long ns = 0, cap = 0;
    while (got < k) {
        emq_sv *popped;
        long long len = emq_zpopmin(e, wk, k - got, &popped);
        if (len == 0) break;
        for (long long i = 0; i < len; i++) {
            emq_sv id = popped[i];
            emq_sv jk = emq_key2(e, EMQ_KP_JOB, id);
            emq_sv row[4];
            /* HMGET then HSET of the row through one write handle (emq_hrow): the usual
             * claim opens its row once; every other case closes it first. */
            emq_hrow h;
            int hash = emq_hrow_open(e, jk, 4, fields, row, &h);
            long long att = 0;
            int ok = hash && integer_text(row[1]) && branded(id) && emq_parse_ll(row[1], &att);
            int held = ok && !row[3].p;
            if (hash && !held) emq_hrow_close(&h);
            if (ok && expired(row[3], now)) {
                expire_job(e, id, jk, lane, row[1], now);
            } else if (ok) {
                if (row[3].p) emq_call(e, "HDEL", 2, jk, EMQ_LIT("expires"));
                att += 1;
                emq_sv a = emq_fmt_ll(e, att);
                int nh = e->claim_stamp.p ? 9 : 7;
                if (held) {
                    /* The constant names and values as the call's server strings. */
                    RedisModuleString *as = RedisModule_CreateString(e->ctx, a.p, a.n);
                    RedisModuleString *hv[9] = {NULL, emq_lit_str(e, F_ATTEMPTS), as,
                                                emq_lit_str(e, F_STATE), emq_lit_str(e, V_ACTIVE),
                                                emq_lit_str(e, F_EPOCH), as, NULL, NULL};
                    if (nh == 9) {
                        hv[7] = emq_lit_str(e, F_CLAIMED);
                        hv[8] = RedisModule_CreateString(e->ctx, e->claim_stamp.p,
                                                         e->claim_stamp.n);
                    }
                    emq_hrow_hset(e, &h, nh, hv);
                } else {
                    emq_sv hs[9] = {jk, EMQ_LIT("attempts"), a, EMQ_LIT("state"),
                                    EMQ_LIT("active"), EMQ_LIT("lease_epoch"), a,
                                    EMQ_LIT("claimed_ms"), e->claim_stamp};
                    emq_hsetv(e, nh, hs);
                }
                if (ns + 2 > cap) {
                    long long nc = cap ? cap * 2 : 32;
                    emq_sv *grown = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(nc + 1));
                    if (ns) memcpy(grown + 1, scored + 1, sizeof(emq_sv) * (size_t)ns);
                    scored = grown;
                    cap = nc;
                }
                /* scored[0] is kept free for the key of the chunked ZADD. */
                scored[1 + ns++] = dl;
                scored[1 + ns++] = id;
                emq_job j = {id, row[0].p ? row[0] : EMQ_LIT(""), att, lane, row[2]};
                push_job(e, out, j);
                emq_sv extra[2] = {EMQ_LIT("attempts"), a};
                emq_emit_in(e, "active", id, lane, 2, extra);
                got++;
            } else if (hash && emq_exists(e, jk) == 1) {
                emq_sv why = branded(id) ? EMQ_LIT("malformed row: attempts is not an integer")
                                         : EMQ_LIT("malformed row: the id is not a branded job id");
                emq_hset(e, 5, jk, EMQ_LIT("state"), EMQ_LIT("dead"), EMQ_LIT("last_error"),
                         why);
                emq_call(e, "HDEL", 2, jk, EMQ_LIT("lease_epoch"));
                emq_dead_letter(e, id, now);
                emq_bump_metrics(e, "failed", 1, 0);
                emq_sv extra[2] = {EMQ_LIT("error"), why};
                emq_emit(e, "dead", id, 2, extra);
            } else if (emq_exists(e, jk) == 1) {
                log_dropped(e, id, wk);
            }
        }
    }
    if (got > 0) {
        /* call_chunked('ZADD', active, scored, 2000) */
        emq_sv active = emq_key(e, EMQ_K_ACTIVE);
        for (long long i = 0; i < ns; i += 2000) {
            long long m = ns - i < 2000 ? ns - i : 2000;
            emq_sv saved = scored[i];
            scored[i] = active; /* the slot before this chunk: a pair already sent, or [0] */
            emq_zaddv(e, (int)m + 1, scored + i);
            scored[i] = saved;
        }
        if (lane.p) emq_hincrby(e, emq_key(e, EMQ_K_GACTIVE), lane, got);
    }
    return got;
}

static long long num_or(emq_sv s, long long dflt) {
    long long v;
    return emq_parse_ll(s, &v) ? v : dflt;
}

/* turn_room: how many jobs the ring head g may take in this turn. */
static long long turn_room(emq *e, emq_sv g, long long want, int alone, long long *w,
                           long long *served) {
    long long k = want;
    if (!alone) {
        *w = num_or(emq_hget(e, emq_key(e, EMQ_K_GWEIGHT), g), 1);
        emq_sv turn[2];
        static const char *rr[2] = {"rr_lane", "rr_n"};
        emq_hmget_strict(e, emq_key(e, EMQ_K_META), 2, rr, turn);
        *served = 0;
        if (emq_eq(turn[0], g)) *served = num_or(turn[1], 0);
        long long room = *w - *served > 1 ? *w - *served : 1;
        if (room < k) k = room;
    }
    if (!emq_eqs(g, "*")) {
        emq_sv lim = emq_hget(e, emq_key(e, EMQ_K_GLIMIT), g);
        if (lim.p) {
            emq_sv act = emq_hget(e, emq_key(e, EMQ_K_GACTIVE), g);
            long long room = num_or(lim, 0) - num_or(act, 0);
            if (room < k) k = room;
        }
        long long max, window;
        if (emq_lane_rate(e, g, &max, &window)) {
            long long left = emq_rate_left(e, emq_key2(e, EMQ_KP_LIMITER, g), max);
            if (left < k) k = left;
        }
    }
    return k;
}

/* charge: count n serves against the head g's turn; rotate it when the turn is spent. */
static void charge(emq *e, emq_sv g, long long n, int live, int alone, long long w,
                   long long served) {
    emq_sv ring = emq_key(e, EMQ_K_RING), meta = emq_key(e, EMQ_K_META);
    if (!live) {
        emq_call(e, "HDEL", 3, meta, EMQ_LIT("rr_lane"), EMQ_LIT("rr_n"));
        return;
    }
    if (alone) return;
    served += n;
    if (served >= w) {
        emq_call(e, "LMOVE", 4, ring, ring, EMQ_LIT("LEFT"), EMQ_LIT("RIGHT"));
        emq_call(e, "HDEL", 3, meta, EMQ_LIT("rr_lane"), EMQ_LIT("rr_n"));
    } else {
        emq_hset(e, 5, meta, EMQ_LIT("rr_lane"), g, EMQ_LIT("rr_n"), emq_fmt_ll(e, served));
    }
}

/* ring_head: the live head of the ring, dropping the stale entries before it. */
static emq_sv ring_head(emq *e) {
    emq_sv ring = emq_key(e, EMQ_K_RING), inring = emq_key(e, EMQ_K_INRING);
    emq_sv stale = emq_key(e, EMQ_K_RINGSTALE);
    for (;;) {
        emq_sv g = emq_lindex(e, ring, 0);
        if (!g.p) return EMQ_NONE;
        if (emq_int(e, emq_call(e, "SISMEMBER", 2, inring, g)) == 1) return g;
        emq_call(e, "LPOP", 1, ring);
        if (emq_int(e, emq_call(e, "SREM", 2, stale, g)) == 0 && emq_serviceable(e, g))
            emq_ring_add(e, g);
    }
}

/* readmit_rated (D21): lanes whose window reopened come back to the ring. */
static void readmit_rated(emq *e, long long now) {
    if (!emq_any_lane_rated(e)) return;
    emq_sv rw = emq_key(e, EMQ_K_RATEWAIT);
    RedisModuleCallReply *due = emq_call(e, "ZRANGEBYSCORE", 6, rw, EMQ_LIT("-inf"),
                                         emq_fmt_ll(e, now), EMQ_LIT("LIMIT"), EMQ_LIT("0"),
                                         EMQ_LIT("100"));
    size_t len = RedisModule_CallReplyLength(due);
    for (size_t i = 0; i < len; i++) {
        emq_sv g = emq_str(e, RedisModule_CallReplyArrayElement(due, i));
        emq_zrem(e, 2, rw, g);
        emq_touch(e, g, 0);
    }
}

long long emq_rate_wait_in(emq *e, long long now, emq_lease *c) {
    emq_queue_rate(e, c);
    if (c->qrated) {
        emq_sv lk = emq_key(e, EMQ_K_LIMITER);
        if (emq_rate_left(e, lk, c->qmax) <= 0) {
            long long pttl = emq_int(e, emq_call(e, "PTTL", 1, lk));
            return pttl > 1 ? pttl : 1;
        }
    }
    if (emq_any_lane_rated(e)) {
        RedisModuleCallReply *first = emq_call(e, "ZRANGE", 4, emq_key(e, EMQ_K_RATEWAIT),
                                               EMQ_LIT("0"), EMQ_LIT("0"), EMQ_LIT("WITHSCORES"));
        if (RedisModule_CallReplyLength(first) > 0) {
            emq_sv s = emq_str(e, RedisModule_CallReplyArrayElement(first, 1));
            char buf[64];
            size_t n = s.n < sizeof buf - 1 ? s.n : sizeof buf - 1;
            memcpy(buf, s.p, n);
            buf[n] = '\0';
            /* tonumber(score) - now, then Lua's number -> integer reply (truncation). */
            double left = strtod(buf, NULL) - (double)now;
            long long ms = (long long)left;
            return ms > 1 ? ms : 1;
        }
    }
    return 0;
}

long long emq_rate_wait(emq *e, long long now) {
    emq_lease c;
    emq_lease_init(&c);
    return emq_rate_wait_in(e, now, &c);
}

long long emq_claim_n(emq *e, long long deadline, long long n, emq_lease *out, long long now) {
    emq_sv ring = emq_key(e, EMQ_K_RING);
    long long got = 0;
    if (now <= 0) now = emq_now_ms(e);
    emq_keep kept; /* kept history: stamp claimed_ms while the queue keeps completed rows */
    emq_keep_parse(e->keep_completed, &kept);
    if (kept.on) e->claim_stamp = emq_fmt_ll(e, now);
    readmit_rated(e, now);
    emq_queue_rate(e, out);
    if (out->qrated) {
        long long left = emq_rate_left(e, emq_key(e, EMQ_K_LIMITER), out->qmax);
        if (left < 0) left = 0;
        if (left < n) n = left;
    }
    n = emq_limit_room(e, out, n);
    while (got < n) {
        emq_sv g = ring_head(e);
        if (!g.p) break;
        int flat = emq_eqs(g, "*");
        int alone = emq_scard(e, emq_key(e, EMQ_K_INRING)) == 1;
        long long leased = 0, w = 1, served = 0;
        if (flat || emq_serviceable(e, g)) {
            long long k = turn_room(e, g, n - got, alone, &w, &served);
            if (k > 0) leased = lease_many(e, g, deadline, k, out, now);
            if (leased > 0 && !flat) {
                long long max, window;
                if (emq_lane_rate(e, g, &max, &window))
                    emq_rate_charge(e, emq_key2(e, EMQ_KP_LIMITER, g), leased, window);
            }
        }
        int live;
        emq_sync(e, flat ? EMQ_NONE : g, 1, &live, NULL);
        if (leased > 0) {
            charge(e, g, leased, live, alone, w, served);
            got += leased;
        } else if (live) {
            emq_call(e, "LMOVE", 4, ring, ring, EMQ_LIT("LEFT"), EMQ_LIT("RIGHT"));
        }
    }
    if (out->qrated && got > 0) emq_rate_charge(e, emq_key(e, EMQ_K_LIMITER), got, out->qwindow);
    emq_trim_dead(e, now); /* keep_dead: a malformed row was dead-lettered (history.h) */
    return got;
}

/* ------------------------------------------------------------------ replies */

typedef int (*null_fn)(RedisModuleCtx *ctx);

void emq_reply_job(emq *e, const emq_job *j) {
    /* Lua false -> a nil bulk. rmapi.h (shared) has no ReplyWithNull: looked up here, before
     * the reply is started, so a failure cannot leave half an array. */
    null_fn reply_null = NULL;
    if (!j->group.p &&
        (RedisModule_GetApi("RedisModule_ReplyWithNull", (void *)&reply_null) != 0 || !reply_null))
        emq_fail(e, "ERR the server lacks RedisModule_ReplyWithNull");
    RedisModule_ReplyWithArray(e->ctx, j->floor.p ? 5 : 4);
    emq_reply_sv(e, j->id);
    emq_reply_sv(e, j->payload);
    RedisModule_ReplyWithLongLong(e->ctx, j->attempts);
    if (j->group.p)
        emq_reply_sv(e, j->group);
    else
        reply_null(e->ctx);
    if (j->floor.p) emq_reply_sv(e, j->floor);
}

/* The deadline now + lease_ms; an integer that would overflow is malformed input (the Lua
 * would score a float), refused like any other malformed number, before any write. */
long long emq_deadline_of(emq *e, long long now, long long lease) {
    long long d;
    if (__builtin_add_overflow(now, lease, &d))
        emq_fail(e, "ERR a numeric argument is not an integer");
    return d;
}
