/* cmd_enqueue_many.c: EMQ.ENQUEUE's second form, the twin of enqueue_many.lua (1 key): one
 * verdict per job, with admit.lua's admission (admit.c) and the call's replay marker. */
#include <string.h>

#include "emq.h"
#include "commands.gen.h"

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
    emq_sv pri = emq_priority_arg(e, emq_arg(e, 8));
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
                emq_reply_sv(e, emq_verdict_sv(v));
            }
            return;
        }
    }
    long long now = emq_now_ms(e);
    long long run_at = 0;
    int has_run_at = emq_run_time(e, mode, value, now, &run_at);
    emq_sv expires = ttl.n ? emq_fmt_ll(e, now + ttl_ms) : EMQ_NONE;
    int fresh = emq_has_char(flags, 'f');
    int jobs = (e->nargs - 9) / 2;
    const char **out = RedisModule_PoolAlloc(e->ctx, sizeof(char *) * (size_t)(jobs + 1));
    long long added = 0, admitted = 0;
    emq_zadd_defer(e); /* the admissions' ZADDs: one per key, before the touch reads the set */
    for (int j = 0; j < jobs; j++) {
        const char *v = emq_admit(e, emq_arg(e, 10 + 2 * j), emq_arg(e, 11 + 2 * j), g,
                                  has_run_at, run_at, now, fresh, pri, expires);
        if (strcmp(v, "enqueued") == 0) added++;
        if (strcmp(v, "enqueued") == 0 || strcmp(v, "scheduled") == 0) admitted++;
        if (strcmp(v, "duplicate") == 0) emq_emit_in(e, "duplicate", emq_arg(e, 10 + 2 * j), g, 0, NULL);
        out[j] = v;
    }
    emq_zadd_flush(e);
    if (added > 0) emq_touch(e, g, added);
    if (marked && admitted > 0) {
        char *codes = RedisModule_PoolAlloc(e->ctx, (size_t)jobs + 1);
        for (int j = 0; j < jobs; j++) codes[j] = code_of(out[j])[0];
        emq_call(e, "SET", 4, rk, (emq_sv){codes, (size_t)jobs}, EMQ_LIT("PX"),
                 emq_fmt_ll(e, replay_ms + 1000));
    }
    RedisModule_ReplyWithArray(e->ctx, jobs);
    for (int j = 0; j < jobs; j++) emq_reply_sv(e, emq_verdict_sv(out[j]));
}
