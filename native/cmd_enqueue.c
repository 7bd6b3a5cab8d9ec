/* cmd_enqueue.c: EMQ.ENQUEUE, the twin of enqueue.lua (2 keys) and enqueue_many.lua (1 key),
 * with admit.lua's admission, replay markers and control.lua's dedup (D20). */
#include <string.h>

#include "emq.h"
#include "commands.gen.h"

static const char *KIND = "EMQKIND job id must be JOB-namespaced";

static emq_sv verdict_sv(const char *v) { return (emq_sv){v, strlen(v)}; }

static int is_job(emq_sv id) { return id.n >= 3 && memcmp(id.p, "JOB", 3) == 0; }

/* admit.lua admit(): policy (kind) before existence (duplicate) before write. has_run_at = 0
 * is Lua's run_at == nil. The row's HSET is the first write (deny-oom, see admit.lua). */
static const char *admit(emq *e, emq_sv id, emq_sv payload, emq_sv g, int has_run_at,
                         long long run_at, long long now, int fresh, emq_sv pri,
                         emq_sv expires) {
    if (!is_job(id)) return "kind";
    emq_sv jk = emq_key2(e, EMQ_KP_JOB, id);
    if (emq_exists(e, jk) == 1) return "duplicate";
    int due = !has_run_at || run_at <= now;
    emq_sv attempts = EMQ_LIT("0");
    if (!fresh) attempts = emq_retired_last(e, id);
    int carried = !emq_eqs(attempts, "0");
    int prioritized = !emq_eqs(pri, "0");
    emq_sv f[16];
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
    emq_hsetv(e, n, f);
    if (carried) emq_unretire(e, id);
    /* A new incarnation of a named id: an earlier one's outcome goes (admit.lua). */
    if (!fresh) emq_del(e, 2, emq_key2(e, EMQ_KP_RESULT, id), emq_key2(e, EMQ_KP_NOTIFY, id));
    if (due) {
        emq_zadd(e, 3, emq_waiting_key(e, g), pri, id);
        emq_emit_in(e, "enqueued", id, g, 0, NULL);
        return "enqueued";
    }
    emq_sv at = emq_fmt_ll(e, run_at);
    emq_zadd(e, 3, emq_key(e, EMQ_K_SCHEDULE), at, id);
    emq_sv extra[2] = {EMQ_LIT("run_at"), at};
    emq_emit_in(e, "scheduled", id, g, 2, extra);
    return "scheduled";
}

/* args.lua priority_arg: an integer argument in 0..2^21, or the refusal. The Lua stores the
 * number, so the text stored is its canonical decimal (a leading zero or '-0' is folded). */
static emq_sv priority_arg(emq *e, emq_sv s) {
    long long p = emq_need_ll(e, s);
    if (p < 0 || p > 2097152) emq_fail(e, "ERR priority must be 0..2097152");
    return emq_fmt_ll(e, p);
}

/* run_time(): 'in' = server clock + ms, 'at' = the caller's absolute ms, else nil. */
static int run_time(emq *e, emq_sv mode, emq_sv value, long long now, long long *run_at) {
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

static long long floor_div(long long a, long long b) {
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* admit.lua marker_of(): p..recent:<replay_ms as sent>:<second>:<nonce[1..2]>, field
 * nonce[3..12] .. the id's last 4 characters. */
static emq_sv marker_key(emq *e, emq_sv nonce, emq_sv rm, emq_sv second) {
    return emq_cat(e, 7, e->base, EMQ_LIT(EMQ_KP_RECENT), rm, EMQ_LIT(":"), second, EMQ_LIT(":"),
                   emq_sub(nonce, 1, 2));
}

static emq_sv marker_field(emq *e, emq_sv id, emq_sv nonce) {
    return emq_cat(e, 2, emq_sub(nonce, 3, -1), emq_sub(id, -4, -1));
}

static void mark_one(emq *e, emq_sv key, emq_sv field, const char *verdict, long long replay_ms,
                     int ttl) {
    emq_sv v = strcmp(verdict, "scheduled") == 0 ? EMQ_LIT("s") : EMQ_LIT("e");
    emq_hset(e, 3, key, field, v);
    if (ttl) emq_call(e, "PEXPIRE", 2, key, emq_fmt_ll(e, replay_ms + 2000));
}

static const char *find_one(emq *e, emq_sv key, emq_sv field) {
    emq_sv v = emq_hget(e, key, field);
    if (emq_eqs(v, "e")) return "replayed";
    if (emq_eqs(v, "s")) return "replayed:scheduled";
    return NULL;
}

/* control.lua dedup_holder(): the holder's id, or absent when the key is free. A debounce
 * holder that still waits takes this enqueue's payload and run time. */
static emq_sv dedup_holder(emq *e, emq_sv did, emq_sv mode, emq_sv payload, int has_run_at,
                           long long run_at, long long now) {
    emq_sv dk = emq_key2(e, EMQ_KP_DE, did);
    emq_sv holder = emq_str(e, emq_call(e, "GET", 1, dk));
    if (!holder.p) return EMQ_NONE;
    emq_sv jk = emq_key2(e, EMQ_KP_JOB, holder);
    if (emq_exists(e, jk) == 0 &&
        emq_int(e, emq_call(e, "PTTL", 1, dk)) == -1)
        return EMQ_NONE;
    if (!emq_eqs(mode, "debounce")) return holder;
    static const char *fields[3] = {"state", "group", "lease_epoch"};
    emq_sv row[3];
    if (!emq_hmget(e, jk, 3, fields, row)) return holder;
    if (!emq_eqs(row[0], "pending") && !emq_eqs(row[0], "scheduled")) return holder;
    emq_hset(e, 3, jk, EMQ_LIT("payload"), payload);
    /* A reaped holder's open lease ends: its old holder cannot settle the folded payload. */
    if (row[2].p) emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"), EMQ_LIT("cancel"));
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

static void take_dedup(emq *e, emq_sv id, emq_sv did, long long ttl_ms) {
    emq_sv dk = emq_key2(e, EMQ_KP_DE, did);
    if (ttl_ms > 0)
        emq_call(e, "SET", 4, dk, id, EMQ_LIT("PX"), emq_fmt_ll(e, ttl_ms));
    else
        emq_call(e, "SET", 2, dk, id);
    emq_hset(e, 3, emq_key2(e, EMQ_KP_JOB, id), EMQ_LIT("dedup"), did);
}

/* enqueue.lua: KEYS row, meta; ARGV base id payload group mode value [flags replay_ms nonce
 * dedup dedup_mode dedup_ttl_ms second priority ttl_ms]. */
void emq_cmd_enqueue(emq *e) {
    emq_sv id = emq_arg(e, 2), payload = emq_arg(e, 3), g = emq_arg(e, 4);
    emq_sv mode = emq_arg(e, 5), value = emq_arg(e, 6);
    if (emq_eqs(g, "")) g = EMQ_NONE;
    emq_sv flags = emq_arg(e, 7);
    emq_sv nonce = emq_arg(e, 9), did = emq_arg(e, 10);
    if (!nonce.p) nonce = EMQ_LIT("");
    if (!did.p) did = EMQ_LIT("");
    /* The numbers the Lua would convert later are checked first: a malformed call is refused
     * before anything is written (the script would raise midway). */
    long long replay_ms = 0, dedup_ttl_ms = 0;
    if (emq_arg(e, 8).p) replay_ms = emq_need_ll(e, emq_arg(e, 8));
    if (did.n) dedup_ttl_ms = emq_need_ll(e, emq_arg(e, 12));
    if (emq_eqs(mode, "in") || emq_eqs(mode, "at")) (void)emq_need_ll(e, value);
    emq_sv pri = EMQ_LIT("0");
    if (emq_arg(e, 14).p) pri = priority_arg(e, emq_arg(e, 14));
    emq_sv ttl = emq_arg(e, 15);
    long long ttl_ms = 0;
    if (ttl.p && ttl.n) ttl_ms = emq_need_ll(e, ttl);
    int resend = emq_has_char(flags, 'r');
    emq_sv second = emq_arg(e, 13);
    long long now = 0;
    if (!emq_eqs(mode, "now") || did.n || (ttl.p && ttl.n) || (nonce.n && !second.p))
        now = emq_now_ms(e);
    emq_sv expires = (ttl.p && ttl.n) ? emq_fmt_ll(e, now + ttl_ms) : EMQ_NONE;
    if (!is_job(id)) {
        RedisModule_ReplyWithError(e->ctx, KIND);
        return;
    }
    emq_sv mk = EMQ_NONE, mf = EMQ_NONE;
    if (nonce.n && replay_ms > 0) {
        emq_sv at = second.p ? second : emq_fmt_ll(e, floor_div(now, 1000));
        mk = marker_key(e, nonce, emq_arg(e, 8), at);
        mf = marker_field(e, id, nonce);
        if (resend) {
            const char *again = find_one(e, mk, mf);
            if (again) {
                emq_reply_sv(e, verdict_sv(again));
                return;
            }
        }
    }
    long long run_at = 0;
    int has_run_at = run_time(e, mode, value, now, &run_at);
    if (did.n) {
        emq_sv holder = dedup_holder(e, did, emq_arg(e, 11), payload, has_run_at, run_at, now);
        if (holder.p) {
            emq_sv extra[4] = {EMQ_LIT("dedup"), did, EMQ_LIT("refused"), id};
            emq_emit(e, "deduplicated", holder, 4, extra);
            emq_reply_sv(e, emq_cat(e, 2, EMQ_LIT("deduplicated:"), holder));
            return;
        }
    }
    int fresh = emq_has_char(flags, 'f');
    const char *verdict =
        admit(e, id, payload, g, has_run_at, run_at, now, fresh, pri, expires);
    int dup = strcmp(verdict, "duplicate") == 0;
    if (dup) emq_emit_in(e, "duplicate", id, g, 0, NULL);
    if (did.n && !dup) take_dedup(e, id, did, dedup_ttl_ms);
    if (strcmp(verdict, "enqueued") == 0) emq_touch(e, g, 1);
    if (mk.p && !dup)
        mark_one(e, mk, mf, verdict, replay_ms, !second.p || emq_has_char(flags, 'x'));
    emq_reply_sv(e, verdict_sv(verdict));
}

static const char *code_of(const char *v) {
    if (strcmp(v, "enqueued") == 0) return "e";
    if (strcmp(v, "scheduled") == 0) return "s";
    if (strcmp(v, "kind") == 0) return "k";
    return "d";
}

/* enqueue_many.lua: KEYS meta; ARGV base group mode value replay_ms nonce flags priority
 * ttl_ms id payload... */
void emq_cmd_enqueue_many(emq *e) {
    emq_sv g = emq_arg(e, 2), mode = emq_arg(e, 3), value = emq_arg(e, 4);
    if (emq_eqs(g, "")) g = EMQ_NONE;
    long long replay_ms = emq_need_ll(e, emq_arg(e, 5));
    emq_sv nonce = emq_arg(e, 6), flags = emq_arg(e, 7);
    if (emq_eqs(mode, "in") || emq_eqs(mode, "at")) (void)emq_need_ll(e, value);
    emq_sv pri = priority_arg(e, emq_arg(e, 8));
    emq_sv ttl = emq_arg(e, 9);
    long long ttl_ms = ttl.n ? emq_need_ll(e, ttl) : 0;
    int marked = replay_ms > 0 && !emq_eqs(nonce, "");
    emq_sv rk = emq_key2(e, EMQ_KP_RECENT, nonce);
    if (marked && emq_has_char(flags, 'r')) {
        emq_sv codes = emq_str(e, emq_call(e, "GET", 1, rk));
        if (codes.p) {
            /* The Lua builds a table from the codes; an unknown code is a nil that ends it. */
            size_t n = 0;
            while (n < codes.n && memchr("esdk", codes.p[n], 4)) n++;
            RedisModule_ReplyWithArray(e->ctx, (long)n);
            for (size_t i = 0; i < n; i++) {
                const char *v = codes.p[i] == 'e'   ? "replayed"
                                : codes.p[i] == 's' ? "replayed:scheduled"
                                : codes.p[i] == 'd' ? "duplicate"
                                                    : "kind";
                emq_reply_sv(e, verdict_sv(v));
            }
            return;
        }
    }
    long long now = emq_now_ms(e);
    long long run_at = 0;
    int has_run_at = run_time(e, mode, value, now, &run_at);
    emq_sv expires = ttl.n ? emq_fmt_ll(e, now + ttl_ms) : EMQ_NONE;
    int fresh = emq_has_char(flags, 'f');
    int jobs = (e->nargs - 9) / 2;
    const char **out = RedisModule_PoolAlloc(e->ctx, sizeof(char *) * (size_t)(jobs + 1));
    long long added = 0, admitted = 0;
    for (int j = 0; j < jobs; j++) {
        const char *v = admit(e, emq_arg(e, 10 + 2 * j), emq_arg(e, 11 + 2 * j), g, has_run_at,
                              run_at, now, fresh, pri, expires);
        if (strcmp(v, "enqueued") == 0) added++;
        if (strcmp(v, "enqueued") == 0 || strcmp(v, "scheduled") == 0) admitted++;
        if (strcmp(v, "duplicate") == 0) emq_emit_in(e, "duplicate", emq_arg(e, 10 + 2 * j), g, 0, NULL);
        out[j] = v;
    }
    if (added > 0) emq_touch(e, g, added);
    if (marked && admitted > 0) {
        char *codes = RedisModule_PoolAlloc(e->ctx, (size_t)jobs + 1);
        for (int j = 0; j < jobs; j++) codes[j] = code_of(out[j])[0];
        emq_call(e, "SET", 4, rk, (emq_sv){codes, (size_t)jobs}, EMQ_LIT("PX"),
                 emq_fmt_ll(e, replay_ms + 1000));
    }
    RedisModule_ReplyWithArray(e->ctx, jobs);
    for (int j = 0; j < jobs; j++) emq_reply_sv(e, verdict_sv(out[j]));
}
