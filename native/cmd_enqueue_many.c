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

#define ENQUEUE_ARITY                                                                        \
    "ERR EMQ.ENQUEUE takes 2 keys (row, meta) and 6..24 args (enqueue) or 1 key (meta) and " \
    "9 + 2n args (enqueue_many)"

/* enqueue_many.lua: KEYS meta; ARGV base group mode value replay_ms nonce flags, then the
 * option tail ('+opt' m name value ..., args.lua opt_pairs) or 0.6's positional priority
 * ttl_ms, then id payload... */
void emq_cmd_enqueue_many(emq *e) {
    emq_sv g = emq_arg(e, 2), mode = emq_arg(e, 3), value = emq_arg(e, 4);
    if (emq_eqs(g, "")) g = EMQ_NONE;
    /* The options, parsed once (the Lua's order of checks). */
    emq_sv pri_arg = EMQ_NONE, ttl = EMQ_NONE, keep_arg = EMQ_NONE;
    int first = 10; /* the first job's id */
    if (emq_eqs(emq_arg(e, 8), "+opt")) {
        long long m = emq_need_ll(e, emq_arg(e, 9));
        if (m < 0 || 9 + 2 * m > e->nargs) emq_fail(e, ENQUEUE_ARITY);
        for (int i = 10; i <= 8 + 2 * (int)m; i += 2) {
            emq_sv name = emq_arg(e, i), *slot;
            if (emq_eqs(name, "priority")) slot = &pri_arg;
            else if (emq_eqs(name, "ttl_ms")) slot = &ttl;
            else if (emq_eqs(name, "keep_logs")) slot = &keep_arg;
            else emq_fail(e, "EMQARG unknown option in the tail (see PROTOCOL §6)");
            if (slot->p) emq_fail(e, "EMQARG an option named twice in the tail");
            *slot = emq_arg(e, i + 1);
        }
        first = 10 + 2 * (int)m;
    } else {
        pri_arg = emq_arg(e, 8);
        ttl = emq_arg(e, 9);
    }
    long long replay_ms = emq_need_ll(e, emq_arg(e, 5));
    emq_sv nonce = emq_arg(e, 6), flags = emq_arg(e, 7);
    emq_sv pri = pri_arg.p ? emq_priority_arg(e, pri_arg) : EMQ_LIT("0");
    if (!ttl.p) ttl = EMQ_LIT("");
    long long ttl_ms = ttl.n ? emq_need_ll(e, ttl) : 0;
    emq_sv keep = keep_arg.p ? emq_keep_logs_arg(e, keep_arg) : EMQ_NONE;
    if (emq_eqs(mode, "in") || emq_eqs(mode, "at")) (void)emq_need_ll(e, value);
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
    int jobs = (e->nargs - first + 1) / 2;
    const char **out = RedisModule_PoolAlloc(e->ctx, sizeof(char *) * (size_t)(jobs + 1));
    long long added = 0, admitted = 0;
    emq_zadd_defer(e); /* the admissions' ZADDs: one per key, before the touch reads the set */
    for (int j = 0; j < jobs; j++) {
        const char *v = emq_admit(e, emq_arg(e, first + 2 * j), emq_arg(e, first + 1 + 2 * j), g,
                                  has_run_at, run_at, now, fresh, pri, expires, keep);
        if (strcmp(v, "enqueued") == 0) added++;
        if (strcmp(v, "enqueued") == 0 || strcmp(v, "scheduled") == 0) admitted++;
        if (strcmp(v, "duplicate") == 0)
            emq_emit_in(e, "duplicate", emq_arg(e, first + 2 * j), g, 0, NULL);
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
