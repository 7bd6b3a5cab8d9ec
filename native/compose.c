/* compose.c: flows (D18) as the settles see them; see compose.h. Each function issues the commands
 * of its Lua twin in compose.lua, in the same order. */
#include "compose.h"

#include "history.h"

#include <string.h>

static const char *FLOW_FIELDS[5] = {"parent", "parent_policy", "children", "parent_queue",
                                     "flow"};

int emq_flow_parent(emq *e, emq_sv jk, emq_flow *f) {
    emq_sv v[5];
    /* hmget (pcall): a planted non-hash row is "no flow", it fails nothing. */
    if (!emq_hmget(e, jk, 5, FLOW_FIELDS, v)) return 0;
    if (!v[0].p && !v[2].p) return 0;
    f->parent = v[0];
    f->policy = v[1];
    f->children = v[2];
    f->parent_queue = v[3];
    f->mark = v[4];
    return 1;
}

int emq_flow_of(const emq_sv *row, emq_flow *f) {
    if (!row[6].p && !row[8].p) return 0;
    f->parent = row[6];
    f->policy = row[7];
    f->children = row[8];
    f->parent_queue = row[9];
    f->mark = row[10];
    return 1;
}

static int cross_queue(const emq_flow *f) { return f->parent_queue.p && f->parent_queue.n > 0; }

/* The entry layouts are in compose.lua (flow_outbox); NUL separates the fields. */
static void flow_outbox(emq *e, const emq_flow *f, emq_sv id, int done, emq_sv value) {
    emq_sv nul = {"\0", 1}, entry;
    /* The parent's id, then ':' and the child's flow mark when it has one. */
    emq_sv parent = f->mark.p ? emq_cat(e, 3, f->parent, EMQ_LIT(":"), f->mark) : f->parent;
    if (done) {
        entry = emq_cat(e, 7, f->parent_queue, nul, parent, nul, id, nul, value);
    } else {
        emq_sv policy = f->policy.p ? f->policy : EMQ_LIT("fp");
        entry = emq_cat(e, 11, (emq_sv){"\0fail\0", 6}, f->parent_queue, nul, parent, nul,
                        id, nul, policy, nul, value, EMQ_LIT(""));
    }
    emq_call(e, "RPUSH", 2, emq_key(e, EMQ_K_FLOW_OUTBOX), entry);
}

/* Batches (issue 42, compose.lua batch_callback): admit a callback kept on the anchor,
 * encoded id NUL lane NUL priority NUL payload, the one time it fires. */
static void batch_callback(emq *e, emq_sv bid, emq_sv spec) {
    const char *a = memchr(spec.p, 0, spec.n);
    const char *b = a ? memchr(a + 1, 0, spec.n - (size_t)(a + 1 - spec.p)) : NULL;
    const char *c = b ? memchr(b + 1, 0, spec.n - (size_t)(b + 1 - spec.p)) : NULL;
    if (!c) return;
    emq_sv id = {spec.p, (size_t)(a - spec.p)};
    emq_sv g = {a + 1, (size_t)(b - a - 1)};
    emq_sv pri = {b + 1, (size_t)(c - b - 1)};
    emq_sv payload = {c + 1, spec.n - (size_t)(c + 1 - spec.p)};
    long long pv = 0;
    if (!emq_parse_ll(pri, &pv)) pv = 0;
    emq_sv jk = emq_key2(e, EMQ_KP_JOB, id);
    if (emq_exists(e, jk)) return;
    if (g.n == 0) g = (emq_sv){NULL, 0};
    emq_sv f[13] = {jk,      EMQ_LIT("state"),   EMQ_LIT("pending"),  EMQ_LIT("attempts"),
                    EMQ_LIT("0"), EMQ_LIT("payload"), payload, EMQ_LIT("batch_of"), bid};
    int n = 9;
    if (g.p) {
        f[n++] = EMQ_LIT("group");
        f[n++] = g;
    }
    emq_sv score = emq_fmt_ll(e, pv);
    if (pv != 0) {
        f[n++] = EMQ_LIT("priority");
        f[n++] = score;
    }
    emq_hsetv(e, n, f);
    emq_zadd(e, 3, emq_waiting_key(e, g), score, id);
    emq_emit_in(e, "enqueued", id, g, 0, NULL);
    int inring, inserted;
    emq_sync(e, g, 0, &inring, &inserted);
    emq_wake(e, 1);
}

/* compose.lua batch_done: the anchor released; 1 when a bare anchor ended here. */
static int batch_done(emq *e, emq_sv pid, emq_sv pk) {
    static const char *fields[3] = {"on_success", "payload", "attempts"};
    emq_sv b[3];
    if (!emq_hmget(e, pk, 3, fields, b)) return 0;
    int ok = emq_hlen(e, emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_UNSUCCESSFUL))) == 0;
    if (ok && b[0].p) batch_callback(e, pid, b[0]);
    emq_call(e, "HDEL", 3, pk, EMQ_LIT("on_success"), EMQ_LIT("on_death"));
    emq_hset(e, 3, pk, EMQ_LIT("batch"), ok ? EMQ_LIT("success") : EMQ_LIT("complete"));
    if (!b[1].p || b[1].n > 0) return 0;
    emq_del(e, 4, emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_DEPS)),
            emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_PROCESSED)), emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_FAILED)),
            emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_UNSUCCESSFUL)));
    emq_del(e, 3, pk, emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_LOGS)),
            emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_ERRORS)));
    emq_retire_one(e, pid, b[2]);
    return 1;
}

/* compose.lua batch_death: the first counted death of a running batch fires on_death. */
static void batch_death(emq *e, emq_sv pid, emq_sv pk, emq_sv id) {
    static const char *fields[3] = {"batch", "state", "on_death"};
    emq_sv b[3];
    if (!emq_hmget(e, pk, 3, fields, b) || !b[0].p || !emq_eqs(b[1], "awaiting_children"))
        return;
    if (emq_int(e, emq_call(e, "HSETNX", 3, pk, EMQ_LIT("died"), id)) == 0) return;
    if (b[2].p) {
        batch_callback(e, pid, b[2]);
        emq_call(e, "HDEL", 2, pk, EMQ_LIT("on_death"));
    }
}

static void flow_release(emq *e, emq_sv pid) {
    static const char *fields[4] = {"state", "group", "priority", "batch"};
    emq_sv pk = emq_key2(e, EMQ_KP_JOB, pid), p[4];
    if (!emq_hmget(e, pk, 4, fields, p) || !emq_eqs(p[0], "awaiting_children")) return;
    if (p[3].p && batch_done(e, pid, pk)) return;
    emq_hset(e, 3, pk, EMQ_LIT("state"), EMQ_LIT("pending"));
    emq_zadd(e, 3, emq_waiting_key(e, p[1]), p[2].p ? p[2] : EMQ_LIT("0"), pid);
    /* A full sync, not touch's flat fast path (compose.lua flow_release, F12). */
    int inring, inserted;
    emq_sync(e, p[1], 0, &inring, &inserted);
    emq_wake(e, 1);
}

static const char *FLOW_HASHES[3] = {EMQ_KT_PROCESSED, EMQ_KT_UNSUCCESSFUL, EMQ_KT_FAILED};

/* flow_parent_row (compose.lua): the row of this child's own parent, a flow parent (it has
 * `children`) with the child's flow mark; gone, an unrelated job admitted under the id since,
 * or a new flow's parent under the re-used id takes nothing. A non-hash is not one. */
static int flow_parent_row(emq *e, emq_sv pk, emq_sv mark) {
    static const char *fields[2] = {"children", "flow"};
    emq_sv p[2];
    if (!emq_hmget(e, pk, 2, fields, p) || !p[0].p) return 0;
    if (!mark.p || !p[1].p) return !mark.p && !p[1].p;
    return emq_eq(p[1], mark);
}

/* flow_recorded: the index in FLOW_HASHES of the hash child id is recorded in, or -1. */
static int flow_recorded(emq *e, emq_sv pk, emq_sv id) {
    for (int i = 0; i < 3; i++) {
        emq_sv hk = emq_cat(e, 2, pk, (emq_sv){FLOW_HASHES[i], strlen(FLOW_HASHES[i])});
        if (emq_int(e, emq_call(e, "HEXISTS", 2, hk, id)) == 1) return i;
    }
    return -1;
}

/* hash: 0 processed, 1 unsuccessful (the FLOW_HASHES index). */
static void flow_settled(emq *e, emq_sv pid, int hash, emq_sv id, emq_sv value, emq_sv mark) {
    emq_sv pk = emq_key2(e, EMQ_KP_JOB, pid);
    if (!flow_parent_row(e, pk, mark)) return;
    int before = flow_recorded(e, pk, id);
    emq_sv hk = emq_cat(e, 2, pk, (emq_sv){FLOW_HASHES[hash], strlen(FLOW_HASHES[hash])});
    if (before == hash) {
        emq_hset(e, 3, hk, id, value);
        return;
    }
    if (before >= 0)
        emq_call(e, "HDEL", 2,
                 emq_cat(e, 2, pk, (emq_sv){FLOW_HASHES[before], strlen(FLOW_HASHES[before])}),
                 id);
    emq_hset(e, 3, hk, id, value);
    if (hash == 1) batch_death(e, pid, pk, id);
    if (before == 0 || before == 1) return;
    if (emq_int(e, emq_call(e, "DECR", 1, emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_DEPS)))) <= 0)
        flow_release(e, pid);
}

static void flow_dropped(emq *e, emq_sv pid, emq_sv id, emq_sv mark) {
    emq_sv pk = emq_key2(e, EMQ_KP_JOB, pid);
    if (!flow_parent_row(e, pk, mark) || flow_recorded(e, pk, id) >= 0) return;
    if (emq_int(e, emq_call(e, "DECR", 1, emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_DEPS)))) <= 0)
        flow_release(e, pid);
}

void emq_flow_child_removed(emq *e, emq_sv id, const emq_flow *f) {
    if (!f || !f->parent.p) return;
    if (cross_queue(f)) {
        emq_flow rm = *f;
        rm.policy = EMQ_LIT("rm");
        flow_outbox(e, &rm, id, 0, EMQ_LIT(""));
    } else {
        flow_dropped(e, f->parent, id, f->mark);
    }
}

void emq_flow_child_done(emq *e, emq_sv id, const emq_flow *f, emq_sv result) {
    if (!f || !f->parent.p) return;
    emq_sv value = result.p ? result : EMQ_LIT("");
    if (cross_queue(f))
        flow_outbox(e, f, id, 1, value);
    else
        flow_settled(e, f->parent, 0, id, value, f->mark);
}

void emq_flow_child_dead(emq *e, emq_sv id, const emq_flow *fin, emq_sv error_text) {
    static const char *fields[3] = {"state", "group", "attempts"};
    emq_flow cur, *f = NULL;
    if (fin) {
        cur = *fin;
        f = &cur;
    }
    emq_sv err = error_text.p ? error_text : EMQ_LIT("");
    int depth = 0;
    while (f && f->parent.p && depth < 16) {
        if (cross_queue(f)) {
            flow_outbox(e, f, id, 0, err);
            return;
        }
        emq_sv pid = f->parent, pk = emq_key2(e, EMQ_KP_JOB, pid);
        if (emq_eqs(f->policy, "id")) {
            flow_settled(e, pid, 1, id, err, f->mark);
            return;
        }
        if (!flow_parent_row(e, pk, f->mark)) return;
        emq_sv fk = emq_cat(e, 2, pk, EMQ_LIT(EMQ_KT_FAILED));
        if (emq_int(e, emq_call(e, "HSETNX", 3, fk, id, err)) == 0) return;
        emq_sv p[3];
        if (!emq_hmget(e, pk, 3, fields, p) || !emq_eqs(p[0], "awaiting_children")) return;
        err = emq_cat(e, 3, EMQ_LIT("child "), id, EMQ_LIT(" failed"));
        emq_hset(e, 5, pk, EMQ_LIT("state"), EMQ_LIT("dead"), EMQ_LIT("last_error"), err);
        emq_dead_letter(e, pid, 0);
        emq_keep_death(e, pid, err, p[2], 0, 0);
        id = pid;
        f = emq_flow_parent(e, pk, &cur) ? &cur : NULL;
        depth++;
    }
}

void emq_flow_forget(emq *e, emq_sv jk) {
    emq_del(e, 4, emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_DEPS)),
            emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_PROCESSED)),
            emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_FAILED)),
            emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_UNSUCCESSFUL)));
}

/* end_cancelled (compose.lua): a lapsed job whose holder was asked to stop is dead-lettered
 * "cancelled", or removed for cancel(remove=True); it has already left active. */
void emq_end_cancelled(emq *e, emq_sv id, emq_sv jk, emq_sv g, emq_sv flag, emq_sv attempts,
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
