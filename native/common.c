/* common.c: the twin of src/echomq/lua/include/common.lua (see emq.h): wake, the ring and
 * registry sync (serviceable, ring_add/remove, sync, touch), retire, park and the moves out of
 * the waiting and active sets. Each function names the Lua helper it mirrors and issues its
 * commands in the same order. */
#include "lease.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

void emq_wake(emq *e, long long n) {
    if (n <= 0) return;
    if (n > 64) n = 64;
    emq_sv ones[64];
    for (int i = 0; i < n; i++) ones[i] = EMQ_LIT("1");
    /* LLEN, then LPUSH while fewer than 64 are kept (common.lua wake). */
    emq_lpush_room(e, emq_key(e, EMQ_K_WAKE), (int)n, ones, 64);
}

static double num_or0(emq_sv s) {
    /* tonumber(x or '0') for a planted value: garbage counts as 0 (the Lua would raise). */
    long long v;
    return emq_parse_ll(s, &v) ? (double)v : 0;
}

int emq_serviceable(emq *e, emq_sv g) {
    if (emq_zcard(e, emq_waiting_key(e, g)) == 0) return 0;
    if (emq_eqs(g, "*")) return 1;
    if (emq_int(e, emq_call(e, "SISMEMBER", 2, emq_key(e, EMQ_K_PAUSED), g)) == 1) return 0;
    emq_sv lim = emq_hget(e, emq_key(e, EMQ_K_GLIMIT), g);
    if (lim.p) {
        emq_sv act = emq_hget(e, emq_key(e, EMQ_K_GACTIVE), g);
        if (num_or0(act) >= num_or0(lim)) return 0;
    }
    if (emq_any_lane_rated(e) && emq_rate_blocked(e, g)) return 0;
    return 1;
}

void emq_ring_add(emq *e, emq_sv key) {
    emq_sv stale = emq_key(e, EMQ_K_RINGSTALE), inring = emq_key(e, EMQ_K_INRING);
    if (emq_int(e, emq_call(e, "SMOVE", 3, stale, inring, key)) == 1) return;
    emq_call(e, "RPUSH", 2, emq_key(e, EMQ_K_RING), key);
    emq_call(e, "SADD", 2, emq_key(e, EMQ_K_INRING), key);
}

void emq_ring_remove(emq *e, emq_sv key) {
    emq_sv ring = emq_key(e, EMQ_K_RING);
    emq_call(e, "SREM", 2, emq_key(e, EMQ_K_INRING), key);
    if (emq_scard(e, emq_key(e, EMQ_K_INRING)) == 0) {
        emq_del(e, 2, ring, emq_key(e, EMQ_K_RINGSTALE));
    } else if (emq_eq(emq_lindex(e, ring, 0), key)) {
        emq_call(e, "LPOP", 1, ring);
    } else if (emq_eq(emq_lindex(e, ring, -1), key)) {
        emq_call(e, "RPOP", 1, ring);
    } else {
        emq_call(e, "SADD", 2, emq_key(e, EMQ_K_RINGSTALE), key);
    }
}

void emq_sync(emq *e, emq_sv g, int known_inring, int *inring_out, int *inserted_out) {
    emq_sv key = g.p ? g : EMQ_FLAT;
    int flat = emq_eqs(key, "*");
    if (!flat) {
        if (emq_zcard(e, emq_waiting_key(e, key)) > 0)
            emq_call(e, "SADD", 2, emq_key(e, EMQ_K_LANES), key);
        else
            emq_call(e, "SREM", 2, emq_key(e, EMQ_K_LANES), key);
    }
    emq_sv ring = emq_key(e, EMQ_K_RING), inr = emq_key(e, EMQ_K_INRING);
    int inring = known_inring || emq_int(e, emq_call(e, "SISMEMBER", 2, inr, key)) == 1;
    if (!inring && emq_scard(e, inr) == 0 &&
        emq_llen(e, ring) > 0) {
        /* A ring written before the SETs existed: adopt its entries once. */
        RedisModuleCallReply *all = emq_call(e, "LRANGE", 3, ring, EMQ_LIT("0"), EMQ_LIT("-1"));
        size_t len = RedisModule_CallReplyLength(all);
        for (size_t i = 0; i < len; i++)
            emq_call(e, "SADD", 2, inr, emq_str(e, RedisModule_CallReplyArrayElement(all, i)));
        emq_del(e, 1, emq_key(e, EMQ_K_RINGSTALE));
        inring = emq_int(e, emq_call(e, "SISMEMBER", 2, inr, key)) == 1;
    }
    int ins = 0, live = 0;
    if (emq_serviceable(e, key)) {
        live = 1;
        if (!inring) {
            emq_ring_add(e, key);
            ins = 1;
        }
    } else {
        if (inring) emq_ring_remove(e, key);
        if (!flat && emq_zcard(e, emq_waiting_key(e, key)) > 0) {
            /* D21: a lane whose window is spent waits in ratewait for its readmission. */
            long long max, window;
            if (emq_lane_rate(e, key, &max, &window)) {
                emq_sv lk = emq_key2(e, EMQ_KP_LIMITER, key);
                if (emq_rate_left(e, lk, max) <= 0 &&
                    !emq_str(e, emq_call(e, "ZSCORE", 2, emq_key(e, EMQ_K_RATEWAIT), key)).p) {
                    long long pttl = emq_int(e, emq_call(e, "PTTL", 1, lk));
                    long long at = emq_now_ms(e) + (pttl > 1 ? pttl : 1);
                    emq_zadd(e, 3, emq_key(e, EMQ_K_RATEWAIT), emq_fmt_ll(e, at), key);
                }
            }
        }
    }
    if (inring_out) *inring_out = live;
    if (inserted_out) *inserted_out = ins;
}

void emq_touch(emq *e, emq_sv g, long long added) {
    if (!g.p && added > 0 &&
        emq_zcard(e, emq_key(e, EMQ_K_PENDING)) > added) {
        /* The flat set was non-empty before: '*' is in the ring already. */
        emq_wake(e, added);
        return;
    }
    int inring, inserted;
    emq_sync(e, g, 0, &inring, &inserted);
    if (inserted)
        emq_wake(e, emq_zcard(e, emq_waiting_key(e, g)));
    else if (inring)
        emq_wake(e, added);
}

#define RETIRED_GEN 25000

void emq_retire(emq *e, const emq_sv *pairs, int n) {
    if (n == 0) return;
    emq_sv rk = emq_key(e, EMQ_K_RETIRED);
    emq_sv args[1001];
    for (int i = 0; i < n; i += 1000) {
        int m = n - i < 1000 ? n - i : 1000;
        args[0] = rk;
        for (int j = 0; j < m; j++) args[1 + j] = pairs[i + j];
        emq_hsetv(e, m + 1, args);
    }
    /* Look at the size on a big batch, or about one small call in eight: the sum of the
     * first id's bytes, not its last byte alone, which ids a caller names may all share
     * (common.lua retire: such deletions never looked, and the generation grew unbounded). */
    if (n < 64) {
        if (pairs[0].n == 0) emq_fail(e, "ERR empty id");
        unsigned sum = 0;
        for (size_t i = 0; i < pairs[0].n; i++) sum += (unsigned char)pairs[0].p[i];
        if (sum % 8 != 0) return;
    }
    if (emq_hlen(e, rk) >= RETIRED_GEN) {
        /* The generation before goes only once it was closed EMQ_ID_REPLAY_MS ago (meta
         * retired_closed): it may hold a minted id a resend still looks for (common.lua). */
        long long now = emq_now_ms(e), closed;
        emq_sv meta = emq_key(e, EMQ_K_META);
        emq_sv at = emq_hget(e, meta, EMQ_LIT("retired_closed"));
        if (at.p && emq_parse_ll(at, &closed) && closed <= now && now - closed < EMQ_ID_REPLAY_MS) {
            /* Held back: the generation grows past RETIRED_GEN (a burst); a TTL lets the
             * server drop it after the burst, on a quiet queue too (common.lua retire). */
            emq_call(e, "PEXPIRE", 2, rk, emq_fmt_ll(e, 2 * EMQ_ID_REPLAY_MS));
            return;
        }
        emq_call(e, "UNLINK", 1, emq_key(e, EMQ_K_RETIRED_OLD));
        emq_call(e, "RENAME", 2, rk, emq_key(e, EMQ_K_RETIRED_OLD));
        emq_hset(e, 3, meta, EMQ_LIT("retired_closed"), emq_fmt_ll(e, now));
    }
}

/* common.lua retire_one: every deleted row, '0' (never claimed) included. */
void emq_retire_one(emq *e, emq_sv id, emq_sv attempts) {
    if (attempts.p && emq_is_digits(attempts)) {
        emq_sv pair[2] = {id, attempts};
        emq_retire(e, pair, 2);
    }
}

/* common.lua retired_last: the last token ('0' when absent), *found = recorded at all. */
emq_sv emq_retired_last(emq *e, emq_sv id, int *found) {
    emq_sv v = emq_hget(e, emq_key(e, EMQ_K_RETIRED), id);
    if (!v.p) v = emq_hget(e, emq_key(e, EMQ_K_RETIRED_OLD), id);
    *found = v.p != NULL;
    return v.p ? v : EMQ_LIT("0");
}

void emq_unretire(emq *e, emq_sv id) {
    emq_call(e, "HDEL", 2, emq_key(e, EMQ_K_RETIRED), id);
    emq_call(e, "HDEL", 2, emq_key(e, EMQ_K_RETIRED_OLD), id);
}

void emq_park(emq *e, emq_sv id, emq_sv jk, emq_sv g) {
    /* Scored by the row's priority (absent = 0): common.lua park. */
    emq_sv pri = emq_hget(e, jk, EMQ_LIT("priority"));
    emq_zadd(e, 3, emq_waiting_key(e, g), pri.p ? pri : EMQ_LIT("0"), id);
    emq_hset(e, 3, jk, EMQ_LIT("state"), EMQ_LIT("pending"));
}

void emq_free_slot(emq *e, emq_sv g) {
    emq_sv ga = emq_key(e, EMQ_K_GACTIVE);
    if (emq_hincrby(e, ga, g, -1) <= 0)
        emq_call(e, "HDEL", 2, ga, g);
}

long long emq_leave_active(emq *e, emq_sv id, emq_sv g) {
    long long n = emq_zrem(e, 2, emq_key(e, EMQ_K_ACTIVE), id);
    if (n == 1 && g.p) {
        emq_free_slot(e, g);
        emq_touch(e, g, 0);
    }
    return n;
}

long long emq_leave_waiting(emq *e, emq_sv id, emq_sv g) {
    long long n = emq_zrem(e, 2, emq_waiting_key(e, g), id);
    emq_sync(e, g, 0, NULL, NULL);
    return n;
}

int emq_claim_gate(emq *e, emq_lease *out) {
    static const char *fields[7] = {"paused", "rate_max", "rate_window_ms", "events", "grated",
                                    "limit", "keep_completed"};
    emq_sv m[7];
    /* rcall in the Lua: a non-hash meta fails the claim (WRONGTYPE), so no pcall here. */
    emq_hmget_strict(e, emq_key(e, EMQ_K_META), 7, fields, m);
    emq_seed_limit(out, m[5]);
    e->keep_completed = m[6]; /* kept history (history.h), for settle's completions */
    e->keep_known = 1;
    e->events_bound = m[3];
    e->events_known = 1;
    emq_seed_queue_rate(out, m[1], m[2]);
    e->lanes_rated = m[4].p != NULL;
    return m[0].p != NULL;
}

/* ---- tally/tally_add: the sweep's touch_all tally, jobs added per waiting set in the order
 * first met ----
 * The script keeps the same ordered tally (common.lua's tally/tally_add) and touches the
 * lanes, which re-enter the ring by RPUSH, in that order, so both executors leave one ring.
 * (It walked pairs() once, an order that follows the server Lua's string hash: Valkey's
 * differs from Redis's.) Linear probing over at most `cap` keys, a table of >= 2 * cap. */

static size_t fnv1a(emq_sv s) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < s.n; i++) h = (h ^ (unsigned char)s.p[i]) * 16777619u;
    return h;
}

void emq_tally_init(emq *e, emq_tally *t, size_t cap) {
    size_t size = 2;
    while (size < 2 * cap) size <<= 1;
    t->entry = RedisModule_PoolAlloc(e->ctx, sizeof(emq_tally_entry) * cap);
    t->slot = RedisModule_PoolAlloc(e->ctx, sizeof(int) * size);
    for (size_t i = 0; i < size; i++) t->slot[i] = -1;
    t->count = 0;
    t->mask = size - 1;
}

void emq_tally_add(emq_tally *t, emq_sv key, long long by) {
    size_t i = fnv1a(key) & t->mask;
    for (; t->slot[i] >= 0; i = (i + 1) & t->mask) {
        emq_tally_entry *en = &t->entry[t->slot[i]];
        if (emq_eq(en->key, key)) {
            en->n += by;
            return;
        }
    }
    t->slot[i] = t->count;
    t->entry[t->count++] = (emq_tally_entry){key, by};
}
