/* settle.c: complete_one, retry_one, complete_many (include/settle.lua), command for command
 * in the Lua's order; see settle.h. */
#include "settle.h"

#include <string.h>

#include "compose.h"
#include "history.h"

#define ERRORS_KEPT "-10" /* per job: the errors of its last 10 attempts, in <row>:errors */

static emq_verdict v_int(long long n) { return (emq_verdict){n, NULL}; }
static emq_verdict v_text(const char *t) { return (emq_verdict){0, t}; }

emq_verdict emq_complete_one(emq *e, emq_sv id, emq_sv jk, emq_sv token, emq_sv result,
                             long long now, const emq_keep *keep) {
    emq_sv row[EMQ_ROW_WIDE];
    const char *err;
    int f = emq_fence(e, jk, token, "complete", 1, row, &err);
    if (f == EMQ_FENCE_STALE) return v_text(err);
    if (f == EMQ_FENCE_GONE) return v_int(0);
    /* No release(): the row is deleted just below, lease_epoch with it. */
    if (emq_eqs(row[1], "active"))
        emq_leave_active(e, id, row[2]);
    else
        emq_leave_waiting(e, id, row[2]);
    emq_release_dedup_of(e, id, row[5]);
    emq_flow flow;
    if (emq_flow_of(row, &flow)) {
        emq_flow_child_done(e, id, &flow, result);
        /* A kept parent keeps its children's outcomes; its trim deletes them. */
        if (flow.children.p && !keep->on) emq_flow_forget(e, jk);
    }
    if (keep->on) {
        emq_keep_completed_row(e, id, jk, now);
    } else {
        emq_sv logs = emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_LOGS));
        if (emq_eqs(row[0], "1"))
            emq_del(e, 2, jk, logs);
        else
            emq_del(e, 3, jk, logs, emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_ERRORS)));
        emq_retire_one(e, id, row[0]);
    }
    emq_sv extra[2] = {EMQ_LIT("attempts"), row[0]};
    emq_emit_in(e, "completed", id, row[2], 2, extra);
    return v_int(1);
}

/* Lua's tonumber for what the scripts can hold here (integers); a planted non-number raises
 * in the Lua too (after the same writes). */
static long long lua_int(emq *e, emq_sv s) {
    long long v;
    if (!emq_parse_ll(s, &v)) emq_fail(e, "ERR attempts or floor of the row is not an integer");
    return v;
}

emq_verdict emq_retry_one(emq *e, emq_sv id, emq_sv jk, emq_sv token, long long delay_ms,
                          long long max_attempts, emq_sv error_text, long long now,
                          long long keep_ms) {
    emq_sv row[EMQ_ROW_WIDE];
    const char *err;
    int f = emq_fence(e, jk, token, "retry", 1, row, &err);
    if (f == EMQ_FENCE_STALE) return v_text(err);
    if (f == EMQ_FENCE_GONE) return v_int(0);
    /* D22: the flag is read before release() clears it. */
    int remove = emq_eqs(error_text, "cancelled") &&
                 emq_eqs(emq_hget(e, jk, EMQ_LIT("cancel")), "remove");
    emq_release(e, id, jk, row);
    emq_sv logs = emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_LOGS));
    emq_sv errs = emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_ERRORS));
    /* D22, cancel(remove=True): the holder's "cancelled" settle removes the job. */
    if (remove) {
        emq_release_dedup_of(e, id, row[5]);
        emq_flow rflow;
        if (emq_flow_of(row, &rflow)) emq_flow_child_removed(e, id, &rflow);
        emq_flow_forget(e, jk);
        emq_del(e, 3, jk, logs, errs);
        emq_retire_one(e, id, row[0]);
        emq_sv extra[4] = {EMQ_LIT("state"), EMQ_LIT("active"), EMQ_LIT("cancelled"), EMQ_LIT("1")};
        emq_emit_in(e, "removed", id, row[2], 4, extra);
        if (keep_ms > 0) emq_keep_outcome(e, id, "error", error_text, row[0], keep_ms, now);
        return v_text("removed");
    }
    /* The ceiling counts this incarnation's attempts: a re-admitted id came back with floor. */
    long long attempt = lua_int(e, row[0]) - (row[4].p ? lua_int(e, row[4]) : 0);
    emq_call(e, "RPUSH", 2, errs,
             emq_cat(e, 4, EMQ_LIT("attempt "), emq_fmt_ll(e, attempt), EMQ_LIT(": "), error_text));
    emq_call(e, "LTRIM", 3, errs, EMQ_LIT(ERRORS_KEPT), EMQ_LIT("-1"));
    if (attempt >= max_attempts) {
        emq_hset(e, 5, jk, EMQ_LIT("state"), EMQ_LIT("dead"), EMQ_LIT("last_error"),
                 error_text);
        emq_dead_letter(e, id, now);
        emq_bump_metrics(e, "failed", 1, now);
        emq_sv extra[4] = {EMQ_LIT("attempts"), row[0], EMQ_LIT("error"), error_text};
        emq_emit_in(e, "dead", id, row[2], 4, extra);
        emq_release_dedup_of(e, id, row[5]);
        emq_keep_death(e, id, error_text, row[0], keep_ms, now);
        emq_flow flow;
        if (emq_flow_of(row, &flow)) emq_flow_child_dead(e, id, &flow, error_text);
        return v_text("dead");
    }
    emq_hset(e, 5, jk, EMQ_LIT("state"), EMQ_LIT("scheduled"), EMQ_LIT("last_error"),
             error_text);
    emq_zadd(e, 3, emq_key(e, EMQ_K_SCHEDULE), emq_fmt_ll(e, now + delay_ms), id);
    emq_sv extra[4] = {EMQ_LIT("attempts"), row[0], EMQ_LIT("delay_ms"), emq_fmt_ll(e, delay_ms)};
    emq_emit_in(e, "retried", id, row[2], 4, extra);
    return v_text("scheduled");
}

/* ---- complete_many ---- */

/* The Lua's `seen` table: ids completed earlier in this batch (open addressing, pool memory). */
typedef struct {
    emq_sv *slot;
    size_t mask;
} idset;

static size_t sv_hash(emq_sv s) {
    size_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < s.n; i++) h = (h ^ (unsigned char)s.p[i]) * 1099511628211ULL;
    return h;
}

static emq_sv *idset_find(idset *s, emq_sv id) {
    size_t i = sv_hash(id) & s->mask;
    while (s->slot[i].p && !emq_eq(s->slot[i], id)) i = (i + 1) & s->mask;
    return &s->slot[i];
}

static void del_sliced(emq *e, const char *cmd, emq_sv first, const emq_sv *items, int n) {
    /* The Lua unpacks at most 2000 per command (its C-stack limit): the same slices here. */
    for (int j = 0; j < n; j += 2000) {
        int m = n - j < 2000 ? n - j : 2000;
        int k = first.p ? 1 : 0;
        emq_sv *av = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(m + 1));
        if (k) av[0] = first;
        memcpy(av + k, items + j, sizeof(emq_sv) * (size_t)m);
        if (!strcmp(cmd, "ZREM")) emq_zremv(e, m + k, av);
        else if (!strcmp(cmd, "DEL")) emq_delv(e, m + k, av);
        else emq_callv(e, cmd, m + k, av);
    }
}

int emq_complete_many(emq *e, const emq_sv *pairs, int count, const emq_sv *res_ids,
                      const emq_sv *res_vals, int nres, long long now, const emq_keep *keep,
                      emq_verdict *verdicts) {
    idset seen;
    size_t cap = 8;
    while (cap < (size_t)count * 2) cap <<= 1;
    seen.slot = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * cap);
    memset(seen.slot, 0, sizeof(emq_sv) * cap);
    seen.mask = cap - 1;
    emq_sv *flat = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(count + 1));
    emq_sv *rows = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(3 * count + 1));
    emq_sv *retired = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(2 * count + 1));
    int nflat = 0, nrows = 0, nretired = 0, ok = 0;
    for (int c = 0; c < count; c++) {
        emq_sv id = pairs[2 * c], jk = emq_key2(e, EMQ_KP_JOB, id);
        emq_sv row[EMQ_ROW_WIDE];
        const char *err = NULL;
        int f = EMQ_FENCE_GONE;
        /* The DELs come at the end: an id named twice is gone by its second mention once the
         * first completed it; a refused mention changed nothing, so the next is fenced anew. */
        emq_sv *mark = idset_find(&seen, id);
        /* A kept row is written in place: its second mention is fenced on it (stale). */
        if (!mark->p || keep->on) f = emq_fence(e, jk, pairs[2 * c + 1], "complete", 1, row, &err);
        if (f == EMQ_FENCE_STALE) {
            verdicts[c] = v_text(err);
            continue;
        }
        if (f == EMQ_FENCE_GONE) {
            verdicts[c] = v_int(0);
            continue;
        }
        *mark = id;
        if (!emq_eqs(row[1], "active"))
            emq_leave_waiting(e, id, row[2]);
        else if (row[2].p)
            emq_leave_active(e, id, row[2]);
        else
            flat[nflat++] = id;
        if (row[5].p) emq_release_dedup_of(e, id, row[5]);
        emq_flow flow;
        if (emq_flow_of(row, &flow)) {
            /* (results and results[id]) or '': the last assignment of the id wins. */
            emq_sv result = EMQ_LIT("");
            for (int r = nres - 1; r >= 0; r--) {
                if (emq_eq(res_ids[r], id)) {
                    if (res_vals[r].p) result = res_vals[r];
                    break;
                }
            }
            emq_flow_child_done(e, id, &flow, result);
            if (flow.children.p && !keep->on) {
                /* A parent's row goes now with its flow keys, not with the batch's DELs: a
                 * child of it later in this batch must find it gone (settle.lua, F14). A kept
                 * parent keeps its row and its children's outcomes (D25). */
                emq_flow_forget(e, jk);
                emq_del(e, 1, jk);
            }
        }
        if (keep->on) {
            emq_keep_completed_row(e, id, jk, now);
        } else {
            rows[nrows++] = jk;
            rows[nrows++] = emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_LOGS));
            /* Only a retry writes <row>:errors, and a job that was retried has attempts > 1. */
            if (!emq_eqs(row[0], "1")) rows[nrows++] = emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_ERRORS));
            retired[nretired++] = id;
            retired[nretired++] = row[0];
        }
        emq_sv extra[2] = {EMQ_LIT("attempts"), row[0]};
        emq_emit_in(e, "completed", id, row[2], 2, extra);
        ok++;
        verdicts[c] = v_int(1);
    }
    if (nflat > 0) del_sliced(e, "ZREM", emq_key(e, EMQ_K_ACTIVE), flat, nflat);
    if (nrows > 0) del_sliced(e, "DEL", EMQ_NONE, rows, nrows);
    if (ok > 0) {
        emq_bump_metrics(e, "completed", ok, now);
        if (keep->on)
            emq_kept_trim(e, "completed", keep, ok, now);
        else
            emq_retire(e, retired, nretired);
    }
    return ok;
}

/* A settle verdict as the scripts reply it: an integer, an EMQ* text as an error (when
 * error_if_emq), any other text as a string. */
void emq_reply_verdict(emq *e, emq_verdict v, int error_if_emq) {
    if (!v.text) {
        RedisModule_ReplyWithLongLong(e->ctx, v.n);
    } else if (error_if_emq && v.text[0] == 'E' && v.text[1] == 'M' && v.text[2] == 'Q') {
        RedisModule_ReplyWithError(e->ctx, v.text);
    } else {
        RedisModule_ReplyWithStringBuffer(e->ctx, v.text, strlen(v.text));
    }
}
