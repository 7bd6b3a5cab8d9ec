/* cmd_sweep_stalled.c: EMQ.SWEEP, the twin of sweep_stalled.lua (the counted stall sweep). */
#include <stdint.h>
#include <string.h>

#include "compose.h"
#include "settle.h"
#include "commands.gen.h"

/* ---- touch_all's tally: jobs added per waiting set, in the order first met ----
 * The script keeps the same ordered tally (common.lua's tally/tally_add) and touches the
 * lanes, which re-enter the ring by RPUSH, in that order, so both executors leave one ring.
 * (It walked pairs() once, an order that follows the server Lua's string hash: Valkey's
 * differs from Redis's.) Linear probing over at most `cap` keys, a table of >= 2 * cap. */

typedef struct {
    emq_sv key;
    long long n;
} tally_entry;

typedef struct {
    tally_entry *entry; /* in the order first met */
    int count;
    int *slot; /* index into entry, -1 = empty */
    size_t mask;
} tally;

static size_t fnv1a(emq_sv s) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < s.n; i++) h = (h ^ (unsigned char)s.p[i]) * 16777619u;
    return h;
}

static void tally_init(emq *e, tally *t, size_t cap) {
    size_t size = 2;
    while (size < 2 * cap) size <<= 1;
    t->entry = RedisModule_PoolAlloc(e->ctx, sizeof(tally_entry) * cap);
    t->slot = RedisModule_PoolAlloc(e->ctx, sizeof(int) * size);
    for (size_t i = 0; i < size; i++) t->slot[i] = -1;
    t->count = 0;
    t->mask = size - 1;
}

static void tally_add(tally *t, emq_sv key, long long by) {
    size_t i = fnv1a(key) & t->mask;
    for (; t->slot[i] >= 0; i = (i + 1) & t->mask) {
        tally_entry *en = &t->entry[t->slot[i]];
        if (emq_eq(en->key, key)) {
            en->n += by;
            return;
        }
    }
    t->slot[i] = t->count;
    t->entry[t->count++] = (tally_entry){key, by};
}

/* ---- the sweep ---- */

/* redis.pcall('HINCRBY', jk, 'stalled', 1): 0 when it answers an error (nothing written). */
static int pcall_hincrby(emq *e, emq_sv jk, long long *out) {
    RedisModuleString *av[3] = {RedisModule_CreateString(e->ctx, jk.p, jk.n),
                                RedisModule_CreateString(e->ctx, "stalled", 7),
                                RedisModule_CreateString(e->ctx, "1", 1)};
    RedisModuleCallReply *r = RedisModule_Call(e->ctx, "HINCRBY", "!v", av, (size_t)3);
    if (!r || RedisModule_CallReplyType(r) != REDISMODULE_REPLY_INTEGER) return 0;
    *out = RedisModule_CallReplyInteger(r);
    return 1;
}

/* end_cancelled (compose.lua): a lapsed job whose holder was asked to stop is dead-lettered
 * "cancelled", or removed for cancel(remove=True); it has already left active. */
static void end_cancelled(emq *e, emq_sv id, emq_sv jk, emq_sv g, emq_sv flag, emq_sv attempts,
                          long long now) {
    emq_flow flow;
    int inflow = emq_flow_parent(e, jk, &flow);
    emq_release_dedup(e, id, jk);
    if (emq_eqs(flag, "remove")) {
        if (inflow) emq_flow_child_removed(e, id, &flow);
        emq_flow_forget(e, jk);
        emq_del(e, 3, jk, emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_LOGS)),
                emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_ERRORS)));
        emq_retire_one(e, id, attempts);
        emq_sv extra[4] = {EMQ_LIT("state"), EMQ_LIT("active"), EMQ_LIT("cancelled"), EMQ_LIT("1")};
        emq_emit_in(e, "removed", id, g, 4, extra);
    } else {
        emq_hset(e, 5, jk, EMQ_LIT("state"), EMQ_LIT("dead"), EMQ_LIT("last_error"),
                 EMQ_LIT("cancelled"));
        emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"), EMQ_LIT("cancel"));
        emq_dead_letter(e, id, now);
        emq_bump_metrics(e, "failed", 1, now);
        emq_sv extra[2] = {EMQ_LIT("error"), EMQ_LIT("cancelled")};
        emq_emit_in(e, "dead", id, g, 2, extra);
        if (inflow) emq_flow_child_dead(e, id, &flow, EMQ_LIT("cancelled"));
    }
    if (emq_exists(e, emq_key2(e, EMQ_KP_WANT, id)) == 1)
        emq_keep_outcome(e, id, "error", EMQ_LIT("cancelled"), attempts, 60000, now);
}

/* KEYS active, dead; ARGV base max_stalled limit. Returns {{recovered...}, {dead...}}. */
void emq_cmd_sweep_stalled(emq *e) {
    long long max_stalled = emq_need_ll(e, emq_arg(e, 2));
    emq_sv limit = emq_fmt_ll(e, emq_need_ll(e, emq_arg(e, 3)));
    long long now = emq_now_ms(e);
    emq_sv active = emq_key_at(e, 1); /* KEYS[2] is dead: dead_letter builds it from the base */
    RedisModuleCallReply *lapsed = emq_call(e, "ZRANGEBYSCORE", 6, active, EMQ_LIT("-inf"),
                                            emq_fmt_ll(e, now), EMQ_LIT("LIMIT"), EMQ_LIT("0"), limit);
    size_t len = RedisModule_CallReplyLength(lapsed);
    emq_sv *ids = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (len + 1));
    for (size_t i = 0; i < len; i++) ids[i] = emq_str(e, RedisModule_CallReplyArrayElement(lapsed, i));
    emq_sv *recovered = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (len + 1));
    emq_sv *died = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (len + 1));
    int nrec = 0, ndied = 0;
    tally added;
    tally_init(e, &added, len + 1); /* each lapsed job brings at most one key, plus the flat set */
    static const char *fields[4] = {"state", "group", "attempts", "cancel"};
    for (size_t i = 0; i < len; i++) {
        emq_sv id = ids[i], jk = emq_key2(e, EMQ_KP_JOB, id);
        emq_zrem(e, 2, active, id);
        emq_sv row[4] = {EMQ_NONE, EMQ_NONE, EMQ_NONE, EMQ_NONE};
        if (!emq_hmget(e, jk, 4, fields, row)) row[0] = row[1] = row[2] = row[3] = EMQ_NONE;
        emq_sv g = row[1];
        if (g.p) {
            emq_free_slot(e, g);
            tally_add(&added, g, 0);
        }
        if (!row[0].p) continue;
        if (row[3].p) {
            /* D22: its holder was asked to stop; the job does not run again. */
            end_cancelled(e, id, jk, g, row[3], row[2], now);
            died[ndied++] = id;
            continue;
        }
        /* A stall count that is not an integer restarts at this stall (no error midway: the
         * ZREM above is made, the job must land in a set). */
        long long stalled;
        if (!pcall_hincrby(e, jk, &stalled)) {
            stalled = 1;
            emq_hset(e, 3, jk, EMQ_LIT("stalled"), EMQ_LIT("1"));
        }
        emq_sv st = emq_fmt_ll(e, stalled);
        if (stalled >= max_stalled) {
            emq_hset(e, 5, jk, EMQ_LIT("state"), EMQ_LIT("dead"), EMQ_LIT("last_error"),
                     EMQ_LIT("stalled"));
            emq_call(e, "HDEL", 2, jk, EMQ_LIT("lease_epoch"));
            emq_dead_letter(e, id, now);
            emq_bump_metrics(e, "failed", 1, now);
            emq_sv extra[4] = {EMQ_LIT("error"), EMQ_LIT("stalled"), EMQ_LIT("stalled"), st};
            emq_emit_in(e, "dead", id, g, 4, extra);
            emq_release_dedup(e, id, jk);
            emq_flow flow;
            if (emq_flow_parent(e, jk, &flow)) emq_flow_child_dead(e, id, &flow, EMQ_LIT("stalled"));
            /* D17: the row holds no keep time; as cancel does, "stalled" is kept 60 s, only for
             * a waiter already waiting. */
            if (emq_exists(e, emq_key2(e, EMQ_KP_WANT, id)) == 1)
                emq_keep_outcome(e, id, "error", EMQ_LIT("stalled"), row[2], 60000, now);
            died[ndied++] = id;
        } else {
            emq_park(e, id, jk, g);
            emq_sv extra[2] = {EMQ_LIT("stalled"), st};
            emq_emit_in(e, "stalled", id, g, 2, extra);
            tally_add(&added, g.p ? g : EMQ_FLAT, 1);
            recovered[nrec++] = id;
        }
    }
    /* touch_all: every lane that lost an active job is synced, in the order first met. */
    for (int i = 0; i < added.count; i++) {
        tally_entry *en = &added.entry[i];
        emq_touch(e, emq_eqs(en->key, "*") ? EMQ_NONE : en->key, en->n);
    }
    emq_trim_dead(e, now); /* keep_dead (history.h) */
    RedisModule_ReplyWithArray(e->ctx, 2);
    RedisModule_ReplyWithArray(e->ctx, nrec);
    for (int i = 0; i < nrec; i++) emq_reply_sv(e, recovered[i]);
    RedisModule_ReplyWithArray(e->ctx, ndied);
    for (int i = 0; i < ndied; i++) emq_reply_sv(e, died[i]);
}
