/* history.c: kept history (see history.h), in history.lua's command order. */
#include "history.h"

#include <string.h>

#define TRIM_SLACK 100 /* history.lua: a call trims at most added + TRIM_SLACK rows */

/* Lua tonumber of '%d*': absent for an empty part. */
static int part(const char *p, size_t n, long long *out) {
    if (n == 0) return 0;
    return emq_parse_ll((emq_sv){p, n}, out);
}

void emq_keep_parse(emq_sv v, emq_keep *k) {
    memset(k, 0, sizeof(*k));
    if (!v.p) return;
    size_t colon = v.n;
    for (size_t i = 0; i < v.n; i++) {
        if (v.p[i] == ':') {
            if (colon != v.n) return; /* a second ':' fits no '^%d*:%d*$' */
            colon = i;
        } else if (v.p[i] < '0' || v.p[i] > '9') {
            return;
        }
    }
    if (colon == v.n) return;
    k->on = 1;
    k->has_count = part(v.p, colon, &k->count);
    k->has_age = part(v.p + colon + 1, v.n - colon - 1, &k->age);
}

void emq_keep_completed_spec(emq *e, emq_keep *k) {
    if (!e->keep_known) {
        e->keep_completed = emq_hget(e, emq_key(e, EMQ_K_META), EMQ_LIT("keep_completed"));
        e->keep_known = 1;
    }
    emq_keep_parse(e->keep_completed, k);
}

void emq_keep_completed_row(emq *e, emq_sv id, emq_sv jk, long long now) {
    emq_sv at = emq_fmt_ll(e, now);
    emq_hset(e, 5, jk, EMQ_LIT("state"), EMQ_LIT("completed"), EMQ_LIT("finished_ms"), at);
    emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"), EMQ_LIT("cancel"));
    emq_zadd(e, 3, emq_key(e, EMQ_K_COMPLETED), at, id);
}

/* kept_drop: the rows and every side key the lifecycle table ties to them; their tokens
 * retired. */
static void kept_drop(emq *e, RedisModuleCallReply *ids, size_t n, int dead) {
    emq_sv *keys = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (7 * n + 1));
    emq_sv *retired = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (2 * n + 1));
    static const char *fields[2] = {"attempts", "children"};
    static const char *flows[4] = {EMQ_KT_DEPS, EMQ_KT_PROCESSED, EMQ_KT_FAILED,
                                   EMQ_KT_UNSUCCESSFUL};
    int nk = 0, nr = 0;
    for (size_t i = 0; i < n; i++) {
        emq_sv id = emq_str(e, RedisModule_CallReplyArrayElement(ids, i));
        emq_sv jk = emq_key2(e, EMQ_KP_JOB, id), row[2];
        if (!emq_hmget(e, jk, 2, fields, row)) row[0] = row[1] = EMQ_NONE;
        emq_sv att = row[0];
        if (att.p && emq_is_digits(att)) {
            retired[nr++] = id;
            retired[nr++] = att;
        }
        keys[nk++] = jk;
        keys[nk++] = emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_LOGS));
        /* Only a retry writes <row>:errors; only a flow parent has flow keys (history.lua). */
        if (dead || !emq_eqs(att, "1")) keys[nk++] = emq_cat(e, 2, jk, EMQ_LIT(EMQ_KT_ERRORS));
        if (row[1].p)
            for (int s = 0; s < 4; s++)
                keys[nk++] = emq_cat(e, 2, jk, (emq_sv){flows[s], strlen(flows[s])});
    }
    for (int j = 0; j < nk; j += 2000) emq_delv(e, nk - j < 2000 ? nk - j : 2000, keys + j);
    emq_retire(e, retired, nr);
}

void emq_kept_trim(emq *e, const char *set, const emq_keep *k, long long added, long long now) {
    emq_sv key = emq_key(e, set);
    long long n = 0;
    if (k->has_count) n = emq_zcard(e, key) - k->count;
    if (k->has_age) {
        emq_sv upto = emq_cat(e, 2, EMQ_LIT("("), emq_fmt_ll(e, now - k->age));
        long long aged = emq_int(e, emq_call(e, "ZCOUNT", 3, key, EMQ_LIT("-inf"), upto));
        if (aged > n) n = aged;
    }
    if (n <= 0) return;
    if (n > added + TRIM_SLACK) n = added + TRIM_SLACK;
    emq_sv last = emq_fmt_ll(e, n - 1);
    RedisModuleCallReply *ids = emq_call(e, "ZRANGE", 3, key, EMQ_LIT("0"), last);
    emq_call(e, "ZREMRANGEBYRANK", 3, key, EMQ_LIT("0"), last);
    kept_drop(e, ids, RedisModule_CallReplyLength(ids), !strcmp(set, "dead"));
}

void emq_dead_letter(emq *e, emq_sv id, long long now) {
    if (now <= 0) now = emq_now_ms(e);
    emq_zadd(e, 3, emq_key(e, EMQ_K_DEAD), emq_fmt_ll(e, now), id);
    e->dead_added++;
}

void emq_trim_dead(emq *e, long long now) {
    if (e->dead_added == 0) return;
    long long added = e->dead_added;
    e->dead_added = 0;
    if (!e->keep_dead_known) {
        e->keep_dead = emq_hget(e, emq_key(e, EMQ_K_META), EMQ_LIT("keep_dead"));
        e->keep_dead_known = 1;
    }
    emq_keep k;
    emq_keep_parse(e->keep_dead, &k);
    if (k.on) emq_kept_trim(e, "dead", &k, added, now > 0 ? now : emq_now_ms(e));
}
