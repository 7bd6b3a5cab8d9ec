/* control.c: the twin of src/echomq/lua/include/control.lua (see emq.h): cancel flags (D22),
 * kept outcomes' dedup release and the dedup holder (D20) the enqueue reads. Each function
 * names the Lua helper it mirrors and issues its commands in the same order. */
#include "emq.h"

#include <stdio.h>
#include <string.h>

int emq_cancel_flagged(emq *e, emq_sv jk) {
    return emq_int(e, emq_call(e, "HEXISTS", 2, jk, EMQ_LIT("cancel"))) == 1;
}

void emq_release_dedup(emq *e, emq_sv id, emq_sv jk) {
    static const char *fields[1] = {"dedup"};
    emq_sv did;
    /* pcall in the Lua: a planted non-hash row must not fail the settle that carries it. */
    if (emq_hmget(e, jk, 1, fields, &did)) emq_release_dedup_of(e, id, did);
}

void emq_release_dedup_of(emq *e, emq_sv id, emq_sv did) {
    if (!did.p) return;
    emq_sv dk = emq_key2(e, EMQ_KP_DE, did);
    if (emq_eq(emq_str(e, emq_call(e, "GET", 1, dk)), id) &&
        emq_int(e, emq_call(e, "PTTL", 1, dk)) == -1)
        emq_del(e, 1, dk);
}

/* control.lua dedup_holder(): the holder's id, or absent when the key is free. A debounce
 * holder that still waits takes this enqueue's payload, run time, priority (pri, canonical
 * decimal) and expiry (expires absent: none). A waiting holder in another lane than g is not
 * folded: *lane_out is set to its lane ('' none) and the holder is returned unchanged, the
 * caller refuses the call (EMQSTATE), nothing written. */
emq_sv emq_dedup_holder(emq *e, emq_sv did, emq_sv mode, emq_sv payload, int has_run_at,
                        long long run_at, long long now, emq_sv g, emq_sv pri, emq_sv expires,
                        emq_sv keep, emq_sv *lane_out) {
    *lane_out = EMQ_NONE;
    emq_sv dk = emq_key2(e, EMQ_KP_DE, did);
    emq_sv holder = emq_str(e, emq_call(e, "GET", 1, dk));
    if (!holder.p) return EMQ_NONE;
    emq_sv jk = emq_key2(e, EMQ_KP_JOB, holder);
    if (emq_exists(e, jk) == 0 &&
        emq_int(e, emq_call(e, "PTTL", 1, dk)) == -1)
        return EMQ_NONE;
    if (!emq_eqs(mode, "debounce")) return holder;
    static const char *fields[6] = {"state",    "group",   "lease_epoch",
                                    "priority", "expires", "keep_logs"};
    emq_sv row[6];
    if (!emq_hmget(e, jk, 6, fields, row)) return holder;
    if (!emq_eqs(row[0], "pending") && !emq_eqs(row[0], "scheduled")) return holder;
    emq_sv had = row[1].p ? row[1] : EMQ_LIT("");
    if (!emq_eq(had, g.p ? g : EMQ_LIT(""))) {
        *lane_out = had;
        return holder;
    }
    emq_hset(e, 3, jk, EMQ_LIT("payload"), payload);
    /* A reaped holder's open lease ends: its old holder cannot settle the folded payload. */
    if (row[2].p) emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"), EMQ_LIT("cancel"));
    long long old_pri = 0, new_pri = 0;
    if (row[3].p && !emq_parse_ll(row[3], &old_pri)) old_pri = -1;
    (void)emq_parse_ll(pri, &new_pri);
    if (old_pri != new_pri) {
        /* The row field first: a scheduled holder's promotion reads it (common.lua park). */
        if (new_pri == 0)
            emq_call(e, "HDEL", 2, jk, EMQ_LIT("priority"));
        else
            emq_hset(e, 3, jk, EMQ_LIT("priority"), pri);
        emq_call(e, "ZADD", 4, emq_waiting_key(e, row[1]), EMQ_LIT("XX"), pri, holder);
    }
    if (expires.p)
        emq_hset(e, 3, jk, EMQ_LIT("expires"), expires);
    else if (row[4].p)
        emq_call(e, "HDEL", 2, jk, EMQ_LIT("expires"));
    if (keep.p)
        emq_hset(e, 3, jk, EMQ_LIT("keep_logs"), keep);
    else if (row[5].p)
        emq_call(e, "HDEL", 2, jk, EMQ_LIT("keep_logs"));
    int due = !has_run_at || run_at <= now;
    if (emq_eqs(row[0], "scheduled")) {
        emq_zadd(e, 3, emq_key(e, EMQ_K_SCHEDULE), emq_fmt_ll(e, has_run_at ? run_at : now),
                 holder);
    } else if (!due &&
               emq_str(e, emq_call(e, "ZSCORE", 2, emq_waiting_key(e, row[1]), holder)).p) {
        emq_leave_waiting(e, holder, row[1]);
        emq_hset(e, 3, jk, EMQ_LIT("state"), EMQ_LIT("scheduled"));
        emq_zadd(e, 3, emq_key(e, EMQ_K_SCHEDULE), emq_fmt_ll(e, run_at), holder);
    }
    return holder;
}

void emq_take_dedup(emq *e, emq_sv id, emq_sv did, long long ttl_ms) {
    emq_sv dk = emq_key2(e, EMQ_KP_DE, did);
    if (ttl_ms > 0)
        emq_call(e, "SET", 4, dk, id, EMQ_LIT("PX"), emq_fmt_ll(e, ttl_ms));
    else
        emq_call(e, "SET", 2, dk, id);
    emq_hset(e, 3, emq_key2(e, EMQ_KP_JOB, id), EMQ_LIT("dedup"), did);
}

/* ------------------------------------------------------------------ kept outcomes (D17) */

void emq_keep_outcome(emq *e, emq_sv id, const char *field, emq_sv value, emq_sv attempts,
                      long long keep_ms, long long now) {
    if (keep_ms <= 0) return;
    emq_sv rk = emq_key2(e, EMQ_KP_RESULT, id), ms = emq_fmt_ll(e, keep_ms);
    /* DEL: a reprocessed job's earlier outcome must not leave its other field behind. */
    emq_del(e, 1, rk);
    emq_hset(e, 7, rk, (emq_sv){field, strlen(field)}, value, EMQ_LIT("attempts"),
             attempts.p ? attempts : EMQ_LIT("0"), EMQ_LIT("finished_ms"),
             emq_fmt_ll(e, now > 0 ? now : emq_now_ms(e)));
    emq_call(e, "PEXPIRE", 2, rk, ms);
    if (emq_exists(e, emq_key2(e, EMQ_KP_WANT, id)) == 1) {
        emq_sv nk = emq_key2(e, EMQ_KP_NOTIFY, id);
        emq_call(e, "RPUSH", 2, nk, EMQ_LIT("1"));
        emq_call(e, "PEXPIRE", 2, nk, ms);
    }
}

void emq_keep_death(emq *e, emq_sv id, emq_sv error_text, emq_sv attempts, long long keep_ms,
                    long long now) {
    if (keep_ms > 0)
        emq_keep_outcome(e, id, "error", error_text, attempts, keep_ms, now);
    else if (emq_exists(e, emq_key2(e, EMQ_KP_WANT, id)) == 1)
        emq_keep_outcome(e, id, "error", error_text, attempts, 60000, now);
}
