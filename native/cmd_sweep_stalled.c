/* cmd_sweep_stalled.c: EMQ.SWEEP, the twin of sweep_stalled.lua (the counted stall sweep). */
#include <string.h>

#include "compose.h"
#include "settle.h"
#include "commands.gen.h"

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
    emq_tally added;
    emq_tally_init(e, &added, len + 1); /* each lapsed job brings at most one key, plus the flat set */
    static const char *fields[4] = {"state", "group", "attempts", "cancel"};
    for (size_t i = 0; i < len; i++) {
        emq_sv id = ids[i], jk = emq_key2(e, EMQ_KP_JOB, id);
        emq_zrem(e, 2, active, id);
        emq_sv row[4] = {EMQ_NONE, EMQ_NONE, EMQ_NONE, EMQ_NONE};
        if (!emq_hmget(e, jk, 4, fields, row)) row[0] = row[1] = row[2] = row[3] = EMQ_NONE;
        emq_sv g = row[1];
        if (g.p) {
            emq_free_slot(e, g);
            emq_tally_add(&added, g, 0);
        }
        if (!row[0].p) continue;
        if (row[3].p) {
            /* D22: its holder was asked to stop; the job does not run again. */
            emq_end_cancelled(e, id, jk, g, row[3], row[2], now);
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
            emq_tally_add(&added, g.p ? g : EMQ_FLAT, 1);
            recovered[nrec++] = id;
        }
    }
    /* touch_all: every lane that lost an active job is synced, in the order first met. */
    for (int i = 0; i < added.count; i++) {
        emq_tally_entry *en = &added.entry[i];
        emq_touch(e, emq_eqs(en->key, "*") ? EMQ_NONE : en->key, en->n);
    }
    emq_trim_dead(e, now); /* keep_dead (history.h) */
    RedisModule_ReplyWithArray(e->ctx, 2);
    RedisModule_ReplyWithArray(e->ctx, nrec);
    for (int i = 0; i < nrec; i++) emq_reply_sv(e, recovered[i]);
    RedisModule_ReplyWithArray(e->ctx, ndied);
    for (int i = 0; i < ndied; i++) emq_reply_sv(e, died[i]);
}
