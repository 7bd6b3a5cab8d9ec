/* ratelimit.c: the twin of src/echomq/lua/include/ratelimit.lua (see emq.h): the lane rate
 * limits (D21) as the ring and the claims read them; the queue-wide part is in lease.c (the
 * claim core). Each function names the Lua helper it mirrors and issues its commands in the
 * same order. */
#include "emq.h"

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
