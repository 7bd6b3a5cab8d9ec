/* admit.c: the twin of src/echomq/lua/include/admit.lua (see emq.h): admission (policy,
 * then existence, then the row's write), run times and the replay markers, for EMQ.ENQUEUE's
 * two forms. Each function names the Lua one it mirrors. */
#include "emq.h"

#include <string.h>

const char *const EMQ_KIND = "EMQKIND job id must be JOB-namespaced";

emq_sv emq_verdict_sv(const char *v) { return (emq_sv){v, strlen(v)}; }

int emq_is_job(emq_sv id) { return id.n >= 3 && memcmp(id.p, "JOB", 3) == 0; }

/* admit.lua admit(): policy (kind) before existence (duplicate) before write. has_run_at = 0
 * is Lua's run_at == nil. The row's HSET is the first write (deny-oom, see admit.lua). */
const char *emq_admit(emq *e, emq_sv id, emq_sv payload, emq_sv g, int has_run_at,
                      long long run_at, long long now, int fresh, emq_sv pri, emq_sv expires,
                      emq_sv keep) {
    if (!emq_is_job(id)) return "kind";
    emq_sv jk = emq_key2(e, EMQ_KP_JOB, id);
    /* EXISTS, then the row's HSET below, on one write handle (one key lookup). */
    emq_hrow row;
    if (!emq_hrow_open_absent(e, jk, &row)) return "duplicate";
    int due = !has_run_at || run_at <= now;
    emq_sv attempts = EMQ_LIT("0");
    int was = 0;
    if (!fresh) attempts = emq_retired_last(e, id, &was);
    int carried = !emq_eqs(attempts, "0");
    int prioritized = !emq_eqs(pri, "0");
    emq_sv f[18];
    int n = 0;
    f[n++] = jk;
    f[n++] = EMQ_LIT("state");
    f[n++] = due ? EMQ_LIT("pending") : EMQ_LIT("scheduled");
    f[n++] = EMQ_LIT("attempts");
    f[n++] = attempts;
    f[n++] = EMQ_LIT("payload");
    f[n++] = payload;
    if (g.p) {
        f[n++] = EMQ_LIT("group");
        f[n++] = g;
    }
    if (carried) {
        f[n++] = EMQ_LIT("floor");
        f[n++] = attempts;
    }
    if (prioritized) {
        f[n++] = EMQ_LIT("priority");
        f[n++] = pri;
    }
    if (expires.p) { /* issue 24: the claim that meets it past this dead-letters it */
        f[n++] = EMQ_LIT("expires");
        f[n++] = expires;
    }
    if (keep.p) { /* the option keep_logs: add_log.lua trims to it */
        f[n++] = EMQ_LIT("keep_logs");
        f[n++] = keep;
    }
    emq_hrow_hsetv(e, &row, n, f);
    if (was) emq_unretire(e, id);
    /* A new incarnation of a named id: an earlier one's outcome goes (admit.lua). */
    if (!fresh) emq_del(e, 2, emq_key2(e, EMQ_KP_RESULT, id), emq_key2(e, EMQ_KP_NOTIFY, id));
    if (due) {
        emq_zadd_later(e, emq_waiting_key(e, g), pri, id);
        emq_emit_in(e, "enqueued", id, g, 0, NULL);
        return "enqueued";
    }
    emq_sv at = emq_fmt_ll(e, run_at);
    emq_zadd_later(e, emq_key(e, EMQ_K_SCHEDULE), at, id);
    emq_sv extra[2] = {EMQ_LIT("run_at"), at};
    emq_emit_in(e, "scheduled", id, g, 2, extra);
    return "scheduled";
}

/* admit.lua run_time(): 'in' = server clock + ms, 'at' = the caller's absolute ms, else nil. */
int emq_run_time(emq *e, emq_sv mode, emq_sv value, long long now, long long *run_at) {
    if (emq_eqs(mode, "in")) {
        *run_at = now + emq_need_ll(e, value);
        return 1;
    }
    if (emq_eqs(mode, "at")) {
        *run_at = emq_need_ll(e, value);
        return 1;
    }
    return 0;
}

long long emq_floor_div(long long a, long long b) {
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* admit.lua marker_of(): p..recent:<replay_ms as sent>:<second>:<nonce[1..2]>, field
 * nonce[3..12] .. the id's last 4 characters. */
emq_sv emq_marker_key(emq *e, emq_sv nonce, emq_sv rm, emq_sv second) {
    return emq_cat(e, 7, e->base, EMQ_LIT(EMQ_KP_RECENT), rm, EMQ_LIT(":"), second, EMQ_LIT(":"),
                   emq_sub(nonce, 1, 2));
}

emq_sv emq_marker_field(emq *e, emq_sv id, emq_sv nonce) {
    return emq_cat(e, 2, emq_sub(nonce, 3, -1), emq_sub(id, -4, -1));
}

void emq_mark_one(emq *e, emq_sv key, emq_sv field, const char *verdict, long long replay_ms,
                  int ttl) {
    emq_sv v = strcmp(verdict, "scheduled") == 0 ? EMQ_LIT("s") : EMQ_LIT("e");
    emq_hset(e, 3, key, field, v);
    /* admit.lua mark_one: a key deleted under a client that had timed it gets a TTL again. */
    if (ttl || emq_int(e, emq_call(e, "PTTL", 1, key)) == -1)
        emq_call(e, "PEXPIRE", 2, key, emq_fmt_ll(e, replay_ms + 2000));
}

const char *emq_find_one(emq *e, emq_sv key, emq_sv field) {
    emq_sv v = emq_hget(e, key, field);
    if (emq_eqs(v, "e")) return "replayed";
    if (emq_eqs(v, "s")) return "replayed:scheduled";
    return NULL;
}
