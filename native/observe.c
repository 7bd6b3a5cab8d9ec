/* observe.c: the twin of src/echomq/lua/include/observe.lua (see emq.h): events (D15: emit,
 * emit_in) and per-minute metrics (D16: bump_metrics). Each function names the Lua helper it
 * mirrors and issues its commands in the same order. */
#include "emq.h"

#include <stdio.h>
#include <string.h>

void emq_emit(emq *e, const char *event, emq_sv id, int nextra, const emq_sv *extra) {
    if (!e->events_known) {
        e->events_bound = emq_hget(e, emq_key(e, EMQ_K_META), EMQ_LIT("events"));
        e->events_known = 1;
    }
    if (!e->events_bound.p) return;
    emq_sv args[24];
    int n = 0;
    args[n++] = emq_key(e, EMQ_K_EVENTS);
    args[n++] = EMQ_LIT("MAXLEN");
    args[n++] = EMQ_LIT("~");
    args[n++] = e->events_bound;
    args[n++] = EMQ_LIT("*");
    args[n++] = EMQ_LIT("event");
    args[n++] = (emq_sv){event, strlen(event)};
    if (id.p) {
        args[n++] = EMQ_LIT("id");
        args[n++] = id;
    }
    for (int i = 0; i < nextra && n < 24; i++) args[n++] = extra[i];
    emq_callv(e, "XADD", n, args);
}

void emq_emit_in(emq *e, const char *event, emq_sv id, emq_sv g, int nextra,
                 const emq_sv *extra) {
    if (g.p && !emq_eqs(g, "*")) {
        emq_sv more[16];
        more[0] = EMQ_LIT("group");
        more[1] = g;
        for (int i = 0; i < nextra && i < 14; i++) more[2 + i] = extra[i];
        emq_emit(e, event, id, nextra + 2, more);
    } else {
        emq_emit(e, event, id, nextra, extra);
    }
}

static long long floor_div(long long a, long long b) {
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

void emq_bump_metrics(emq *e, const char *kind, long long n, long long now) {
    if (n <= 0) return;
    int done = strcmp(kind, "completed") == 0;
    emq_hincrby(e, emq_key(e, done ? EMQ_K_METRICS_COMPLETED : EMQ_K_METRICS_FAILED),
                EMQ_LIT("count"), n);
    emq_sv key = emq_key(e, done ? EMQ_K_METRICS_COMPLETED_DATA : EMQ_K_METRICS_FAILED_DATA);
    long long minute = floor_div(now > 0 ? now : emq_now_ms(e), 60000);
    emq_sv head = emq_lindex(e, key, 0);
    if (head.p) {
        const char *sep = memchr(head.p, ':', head.n);
        long long m, c;
        if (sep && emq_parse_ll((emq_sv){head.p, (size_t)(sep - head.p)}, &m) && m >= minute) {
            emq_sv rest = {sep + 1, head.n - (size_t)(sep - head.p) - 1};
            if (!emq_parse_ll(rest, &c)) c = 0;
            char buf[48];
            int len = snprintf(buf, sizeof buf, "%lld:%lld", m, c + n);
            emq_lset(e, key, 0, emq_cat(e, 1, (emq_sv){buf, (size_t)len}));
            return;
        }
    }
    char buf[48];
    int len = snprintf(buf, sizeof buf, "%lld:%lld", minute, n);
    emq_call(e, "LPUSH", 2, key, emq_cat(e, 1, (emq_sv){buf, (size_t)len}));
    emq_call(e, "LTRIM", 3, key, EMQ_LIT("0"), EMQ_LIT("1439"));
}
