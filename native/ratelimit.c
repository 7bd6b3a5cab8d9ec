/* ratelimit.c: the twin of src/echomq/lua/include/ratelimit.lua (see emq.h and lease.h): the
 * lane rate limits (D21) as the ring and the claims read them, and the queue-wide rate and
 * concurrency limits the claim core (lease.c) reads into its lease's cache. Each function
 * names the Lua helper it mirrors and issues its commands in the same order. */
#include "lease.h"

#include <stdio.h>
#include <string.h>

int emq_any_lane_rated(emq *e) {
    if (e->lanes_rated < 0)
        e->lanes_rated =
            emq_int(e, emq_call(e, "HEXISTS", 2, emq_key(e, EMQ_K_META), EMQ_LIT("grated"))) == 1;
    return e->lanes_rated;
}

int emq_lane_rate(emq *e, emq_sv g, long long *max, long long *window) {
    if (!emq_any_lane_rated(e)) return 0;
    emq_sv spec = emq_hget(e, emq_key(e, EMQ_K_GRATE), g);
    if (!spec.p) return 0;
    const char *colon = memchr(spec.p, ':', spec.n);
    if (!colon) return 0;
    emq_sv a = {spec.p, (size_t)(colon - spec.p)};
    emq_sv b = {colon + 1, spec.n - a.n - 1};
    if (!emq_is_digits(a) || !emq_is_digits(b)) return 0;
    if (!emq_parse_ll(a, max) || !emq_parse_ll(b, window)) return 0;
    return 1;
}

long long emq_rate_left(emq *e, emq_sv key, long long max) {
    emq_sv used = emq_str(e, emq_call(e, "GET", 1, key));
    long long u = 0;
    if (used.p && !emq_parse_ll(used, &u)) u = 0;
    return max - u;
}

int emq_rate_blocked(emq *e, emq_sv g) {
    if (!emq_any_lane_rated(e)) return 0;
    if (emq_str(e, emq_call(e, "ZSCORE", 2, emq_key(e, EMQ_K_RATEWAIT), g)).p) return 1;
    long long max, window;
    if (!emq_lane_rate(e, g, &max, &window)) return 0;
    return emq_rate_left(e, emq_key2(e, EMQ_KP_LIMITER, g), max) <= 0;
}

/* ---- the queue-wide limits, cached on a claim's lease (lease.h) ---- */

/* seed_queue_rate: a rate_max that is not an integer reads as "no limit", as the Lua's
 * tonumber(nil-ish) leaves qmax nil. A window that is not an integer is kept as -1: the
 * script would raise at rate_charge's PEXPIRE, and so does rate_charge below. */
void emq_seed_queue_rate(emq_lease *c, emq_sv max, emq_sv window) {
    c->qrate_known = 1;
    c->qrated = 0;
    if (max.p && emq_parse_ll(max, &c->qmax)) {
        c->qrated = 1;
        if (!emq_parse_ll(window, &c->qwindow)) c->qwindow = -1;
    }
}

void emq_queue_rate(emq *e, emq_lease *c) {
    if (c->qrate_known) return;
    static const char *fields[2] = {"rate_max", "rate_window_ms"};
    emq_sv v[2];
    emq_hmget(e, emq_key(e, EMQ_K_META), 2, fields, v);
    emq_seed_queue_rate(c, v[0], v[1]);
}

void emq_rate_charge(emq *e, emq_sv key, long long n, long long window) {
    if (emq_int(e, emq_call(e, "INCRBY", 2, key, emq_fmt_ll(e, n))) == n) {
        if (window < 0)
            emq_fail(e, "ERR Lua redis() command arguments must be strings or integers");
        emq_call(e, "PEXPIRE", 2, key, emq_fmt_ll(e, window));
    }
}

/* ratelimit.lua qlimit: tonumber(meta.limit) or false. */
void emq_seed_limit(emq_lease *c, emq_sv lim) {
    c->qlimit_known = 1;
    c->qlimited = lim.p && emq_parse_ll(lim, &c->qlimit);
}

/* ratelimit.lua limit_room: n capped by the queue-wide concurrency limit's room, >= 0. */
long long emq_limit_room(emq *e, emq_lease *c, long long n) {
    if (!c->qlimit_known) emq_seed_limit(c, emq_hget(e, emq_key(e, EMQ_K_META), EMQ_LIT("limit")));
    if (!c->qlimited) return n;
    long long room = c->qlimit - emq_card(e, emq_key(e, EMQ_K_ACTIVE), REDISMODULE_KEYTYPE_ZSET);
    if (room < n) n = room;
    return n > 0 ? n : 0;
}
