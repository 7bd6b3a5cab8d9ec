/* emq.c: the shared layer (see emq.h). Each function names the Lua helper it mirrors; the
 * command order follows the Lua so the keyspace (and the replicated effects) end identical. */
#include "emq.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ frame */

static emq_sv sv_of(RedisModuleString *s) {
    emq_sv v;
    v.p = RedisModule_StringPtrLen(s, &v.n);
    return v;
}

/* A base must carry a non-empty {tag}: that is what pins every key built from it to the
 * slot of the declared keys (D9). */
static int has_tag(emq_sv b) {
    const char *open = memchr(b.p, '{', b.n);
    if (!open) return 0;
    size_t rest = b.n - (size_t)(open - b.p) - 1;
    const char *close = memchr(open + 1, '}', rest);
    return close != NULL && close > open + 1;
}

static emq_body pick_form(const emq_command *cmd, int nkeys, int nargs) {
    for (int i = 0; i < cmd->nforms; i++) {
        const emq_form *f = &cmd->forms[i];
        if (nkeys == f->nkeys && nargs >= f->amin && (f->amax < 0 || nargs <= f->amax) &&
            (nargs - f->amin) % f->astep == 0)
            return f->body;
    }
    return NULL;
}

int emq_run(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, const emq_command *cmd) {
    /* getkeys-api: the server (cluster slot check, COMMAND GETKEYS, ACL) asks for the keys
     * exactly as EVAL declares them: numkeys at argv[1], the keys right after. A malformed
     * numkeys names no key; the call itself then answers ERR. */
    if (RedisModule_IsKeysPositionRequest(ctx)) {
        long long n;
        if (argc >= 2 && emq_parse_ll(sv_of(argv[1]), &n) && n >= 0 && n <= (long long)argc - 2)
            for (int i = 0; i < (int)n; i++) RedisModule_KeyAtPos(ctx, 2 + i);
        return REDISMODULE_OK;
    }
    RedisModule_AutoMemory(ctx);
    if (argc < 2) return RedisModule_ReplyWithError(ctx, "ERR wrong number of arguments");
    long long nk;
    if (!emq_parse_ll(sv_of(argv[1]), &nk))
        return RedisModule_ReplyWithError(ctx, "ERR value is not an integer or out of range");
    if (nk < 0) return RedisModule_ReplyWithError(ctx, "ERR Number of keys can't be negative");
    if (nk > (long long)argc - 2)
        return RedisModule_ReplyWithError(
            ctx, "ERR Number of keys can't be greater than number of args");
    int nkeys = (int)nk, nargs = argc - 2 - nkeys;
    emq_body body = pick_form(cmd, nkeys, nargs);
    if (!body) return RedisModule_ReplyWithError(ctx, cmd->arity_error);
    /* Heap, not stack: its fields are read after a longjmp. */
    emq *e = RedisModule_PoolAlloc(ctx, sizeof(emq));
    memset(e, 0, sizeof(*e));
    e->ctx = ctx;
    e->nkeys = nkeys;
    e->nargs = nargs;
    e->keys = RedisModule_PoolAlloc(ctx, sizeof(emq_sv) * (size_t)(nkeys + 1));
    e->args = RedisModule_PoolAlloc(ctx, sizeof(emq_sv) * (size_t)(nargs + 1));
    for (int i = 0; i < nkeys; i++) e->keys[i] = sv_of(argv[2 + i]);
    for (int i = 0; i < nargs; i++) e->args[i] = sv_of(argv[2 + nkeys + i]);
    e->base = e->args[0];
    e->lanes_rated = -1;
    if (!has_tag(e->base))
        return RedisModule_ReplyWithError(ctx, "ERR base must contain a {hash tag}");
    for (int i = 0; i < nkeys; i++) {
        if (e->keys[i].n < e->base.n || memcmp(e->keys[i].p, e->base.p, e->base.n) != 0)
            return RedisModule_ReplyWithError(
                ctx, "ERR every key must start with the base (ARGV[1]): no cross-slot call");
    }
    if (setjmp(e->fail)) return RedisModule_ReplyWithError(ctx, e->err);
    body(e);
    return REDISMODULE_OK;
}

void emq_fail(emq *e, const char *msg) {
    e->err = msg;
    longjmp(e->fail, 1);
}

void emq_reply_sv(emq *e, emq_sv s) { RedisModule_ReplyWithStringBuffer(e->ctx, s.p, s.n); }

/* ------------------------------------------------------------------ values */

emq_sv emq_arg(emq *e, int i) { return (i >= 1 && i <= e->nargs) ? e->args[i - 1] : EMQ_NONE; }
emq_sv emq_key_at(emq *e, int i) { return (i >= 1 && i <= e->nkeys) ? e->keys[i - 1] : EMQ_NONE; }

int emq_eq(emq_sv a, emq_sv b) {
    if (!a.p || !b.p) return a.p == b.p;
    return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

int emq_eqs(emq_sv a, const char *lit) {
    size_t n = strlen(lit);
    return a.p && a.n == n && memcmp(a.p, lit, n) == 0;
}

int emq_has_char(emq_sv s, char c) { return s.p && memchr(s.p, c, s.n) != NULL; }

int emq_is_digits(emq_sv s) {
    if (!s.p || s.n == 0) return 0;
    for (size_t i = 0; i < s.n; i++)
        if (s.p[i] < '0' || s.p[i] > '9') return 0;
    return 1;
}

int emq_parse_ll(emq_sv s, long long *out) {
    if (!s.p || s.n == 0) return 0;
    int neg = s.p[0] == '-';
    size_t i = neg ? 1 : 0;
    if (i == s.n) return 0;
    long long v = 0;
    for (; i < s.n; i++) {
        if (s.p[i] < '0' || s.p[i] > '9') return 0;
        int d = s.p[i] - '0';
        /* Accumulate with the sign so LLONG_MIN parses; anything past 64 bits is refused,
         * never wrapped. */
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, neg ? -d : d, &v))
            return 0;
    }
    *out = v;
    return 1;
}

/* An argument's digits (after an optional '-') are at most 15 (PROTOCOL §6, include/
 * args.lua): exact in a Lua number, so both executors take and refuse the same numbers. */
static int arg_digits_ok(emq_sv s) {
    size_t n = s.n;
    if (n && s.p[0] == '-') n--;
    return n <= 15;
}

long long emq_need_ll(emq *e, emq_sv s) {
    long long v;
    if (!s.p || !arg_digits_ok(s) || !emq_parse_ll(s, &v))
        emq_fail(e, "ERR a numeric argument is not an integer");
    return v;
}

emq_sv emq_fmt_ll(emq *e, long long v) {
    char *buf = RedisModule_PoolAlloc(e->ctx, 24);
    int n = snprintf(buf, 24, "%lld", v);
    return (emq_sv){buf, (size_t)n};
}

emq_sv emq_sub(emq_sv s, long i, long j) {
    long len = (long)s.n;
    if (i < 0) i = len + i + 1 < 1 ? 1 : len + i + 1;
    else if (i == 0) i = 1;
    if (j < 0) j = len + j + 1;
    else if (j > len) j = len;
    if (i > j) return (emq_sv){s.p ? s.p : "", 0};
    return (emq_sv){s.p + i - 1, (size_t)(j - i + 1)};
}

emq_sv emq_cat(emq *e, int n, ...) {
    va_list ap;
    size_t total = 0;
    va_start(ap, n);
    for (int i = 0; i < n; i++) total += va_arg(ap, emq_sv).n;
    va_end(ap);
    char *buf = RedisModule_PoolAlloc(e->ctx, total ? total : 1);
    size_t at = 0;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        emq_sv s = va_arg(ap, emq_sv);
        if (s.n) memcpy(buf + at, s.p, s.n);
        at += s.n;
    }
    va_end(ap);
    return (emq_sv){buf, total};
}

emq_sv emq_key(emq *e, const char *suffix) {
    return emq_cat(e, 2, e->base, (emq_sv){suffix, strlen(suffix)});
}

emq_sv emq_key2(emq *e, const char *suffix, emq_sv x) {
    return emq_cat(e, 3, e->base, (emq_sv){suffix, strlen(suffix)}, x);
}

emq_sv emq_waiting_key(emq *e, emq_sv g) {
    if (g.p && !emq_eqs(g, "*"))
        return emq_cat(e, 4, e->base, EMQ_LIT(EMQ_KP_G), g, EMQ_LIT(EMQ_KT_PENDING));
    return emq_key(e, EMQ_K_PENDING);
}

/* ------------------------------------------------------------------ calls */

static RedisModuleCallReply *raw_callv(emq *e, const char *cmd, int n, const emq_sv *args) {
    RedisModuleString **av = RedisModule_PoolAlloc(e->ctx, sizeof(*av) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) av[i] = RedisModule_CreateString(e->ctx, args[i].p, args[i].n);
    /* '!': replicate this command's effect now, as a script's effects are (the replica and
     * the AOF never see EMQ.*, so they need no module and no clock). */
    return RedisModule_Call(e->ctx, cmd, "!v", av, (size_t)n);
}

RedisModuleCallReply *emq_callv(emq *e, const char *cmd, int n, const emq_sv *args) {
    RedisModuleCallReply *r = raw_callv(e, cmd, n, args);
    if (!r) emq_fail(e, "ERR a server command failed inside the transition");
    if (RedisModule_CallReplyType(r) == REDISMODULE_REPLY_ERROR) {
        size_t len;
        const char *p = RedisModule_CallReplyStringPtr(r, &len);
        char *msg = RedisModule_PoolAlloc(e->ctx, len + 1);
        memcpy(msg, p, len);
        msg[len] = '\0';
        emq_fail(e, msg);
    }
    return r;
}

RedisModuleCallReply *emq_call(emq *e, const char *cmd, int n, ...) {
    emq_sv args[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) args[i] = va_arg(ap, emq_sv);
    va_end(ap);
    return emq_callv(e, cmd, n, args);
}

long long emq_int(emq *e, RedisModuleCallReply *r) {
    if (RedisModule_CallReplyType(r) != REDISMODULE_REPLY_INTEGER)
        emq_fail(e, "ERR unexpected reply type");
    return RedisModule_CallReplyInteger(r);
}

emq_sv emq_str(emq *e, RedisModuleCallReply *r) {
    int t = RedisModule_CallReplyType(r);
    if (t == REDISMODULE_REPLY_NULL) return EMQ_NONE;
    if (t != REDISMODULE_REPLY_STRING) emq_fail(e, "ERR unexpected reply type");
    emq_sv v;
    v.p = RedisModule_CallReplyStringPtr(r, &v.n);
    if (!v.p) v.p = "";
    return v;
}

/* ------------------------------------------------------------------ key API reads */

static const char WRONGTYPE[] = "WRONGTYPE Operation against a key holding the wrong kind of value";

/* A read handle; NULL (type EMPTY) when the key does not exist. The caller closes it
 * before any later write through RedisModule_Call can touch the same key. */
static RedisModuleKey *open_read(emq *e, emq_sv key) {
    return RedisModule_OpenKey(e->ctx, RedisModule_CreateString(e->ctx, key.p, key.n),
                               REDISMODULE_READ);
}

static void close_key(RedisModuleKey *k) {
    if (k) RedisModule_CloseKey(k);
}

/* The value of a returned string, copied into the call's pool (the string itself is the
 * AutoMemory's, but a copy keeps the view valid whatever the caller frees). */
static emq_sv pooled(emq *e, RedisModuleString *s) {
    if (!s) return EMQ_NONE;
    size_t n;
    const char *p = RedisModule_StringPtrLen(s, &n);
    char *buf = RedisModule_PoolAlloc(e->ctx, n ? n : 1);
    if (n) memcpy(buf, p, n);
    return (emq_sv){buf, n};
}

long long emq_exists(emq *e, emq_sv key) {
    RedisModuleKey *k = open_read(e, key);
    int t = RedisModule_KeyType(k);
    close_key(k);
    return t != REDISMODULE_KEYTYPE_EMPTY;
}

long long emq_card(emq *e, emq_sv key, int type) {
    RedisModuleKey *k = open_read(e, key);
    int t = RedisModule_KeyType(k);
    long long n = 0;
    if (t != REDISMODULE_KEYTYPE_EMPTY) {
        if (t != type) {
            close_key(k);
            emq_fail(e, WRONGTYPE);
        }
        n = (long long)RedisModule_ValueLength(k);
    }
    close_key(k);
    return n;
}

/* Reads n fields of a hash; returns 0 (out untouched) for a key that exists and is not a
 * hash, 1 otherwise (absent fields, or an absent key: every out EMQ_NONE). */
static int hash_fields(emq *e, emq_sv key, int n, const char **fields, emq_sv *out) {
    RedisModuleKey *k = open_read(e, key);
    int t = RedisModule_KeyType(k);
    if (t != REDISMODULE_KEYTYPE_EMPTY && t != REDISMODULE_KEYTYPE_HASH) {
        close_key(k);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        RedisModuleString *v = NULL;
        if (k) RedisModule_HashGet(k, REDISMODULE_HASH_CFIELDS, fields[i], &v, NULL);
        out[i] = pooled(e, v);
    }
    close_key(k);
    return 1;
}

emq_sv emq_hget(emq *e, emq_sv key, emq_sv field) {
    /* A field with a NUL byte cannot be named as a C string: ask the server instead. */
    if (memchr(field.p, '\0', field.n)) return emq_str(e, emq_call(e, "HGET", 2, key, field));
    /* CFIELDS wants a C string: the field is copied with its terminator. */
    char *f = RedisModule_PoolAlloc(e->ctx, field.n + 1);
    memcpy(f, field.p, field.n);
    f[field.n] = '\0';
    const char *fields[1] = {f};
    emq_sv out[1];
    if (!hash_fields(e, key, 1, fields, out)) emq_fail(e, WRONGTYPE);
    return out[0];
}

void emq_hmget_strict(emq *e, emq_sv key, int n, const char **fields, emq_sv *out) {
    if (!hash_fields(e, key, n, fields, out)) emq_fail(e, WRONGTYPE);
}

int emq_hmget(emq *e, emq_sv key, int n, const char **fields, emq_sv *out) {
    /* redis.pcall in the Lua: a planted non-hash key answers "no row", it fails nothing. */
    return hash_fields(e, key, n, fields, out);
}

emq_sv emq_lindex(emq *e, emq_sv key, long idx) {
    RedisModuleKey *k = open_read(e, key);
    int t = RedisModule_KeyType(k);
    emq_sv v = EMQ_NONE;
    if (t != REDISMODULE_KEYTYPE_EMPTY) {
        if (t != REDISMODULE_KEYTYPE_LIST) {
            close_key(k);
            emq_fail(e, WRONGTYPE);
        }
        long len = (long)RedisModule_ValueLength(k);
        /* ListGet answers NULL (and sets errno) out of range, as LINDEX answers nil. */
        if ((idx >= 0 && idx < len) || (idx < 0 && -idx <= len))
            v = pooled(e, RedisModule_ListGet(k, idx));
    }
    close_key(k);
    return v;
}

/* ------------------------------------------------------------------ key API writes */

static RedisModuleString **strings_of(emq *e, int n, const emq_sv *args) {
    RedisModuleString **av = RedisModule_PoolAlloc(e->ctx, sizeof(*av) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) av[i] = RedisModule_CreateString(e->ctx, args[i].p, args[i].n);
    return av;
}

/* A write handle on a key that is empty or of the given type; WRONGTYPE (nothing written)
 * otherwise, as the command would answer. Closing a written key signals it modified
 * (WATCH, client-side caching), as the command would. */
static RedisModuleKey *open_write(emq *e, RedisModuleString *name, int type) {
    RedisModuleKey *k = RedisModule_OpenKey(e->ctx, name, REDISMODULE_READ | REDISMODULE_WRITE);
    int t = RedisModule_KeyType(k);
    if (t != REDISMODULE_KEYTYPE_EMPTY && t != type) {
        close_key(k);
        emq_fail(e, WRONGTYPE);
    }
    return k;
}

void emq_hsetv(emq *e, int n, const emq_sv *args) {
    if (n < 3 || n % 2 == 0) {
        (void)emq_callv(e, "HSET", n, args); /* the server's own arity error */
        return;
    }
    RedisModuleString **av = strings_of(e, n, args);
    RedisModuleKey *k = open_write(e, av[0], REDISMODULE_KEYTYPE_HASH);
    for (int i = 1; i < n; i += 2)
        RedisModule_HashSet(k, REDISMODULE_HASH_NONE, av[i], av[i + 1], NULL);
    close_key(k);
    RedisModule_Replicate(e->ctx, "HSET", "v", av, (size_t)n);
}

void emq_zaddv(emq *e, int n, const emq_sv *args) {
    if (n < 3 || n % 2 == 0) {
        (void)emq_callv(e, "ZADD", n, args); /* the server's own arity error */
        return;
    }
    /* Every score checked before the first write: a flag or a non-integer score (none on
     * the hot paths) goes to the server whole. */
    double *sc = RedisModule_PoolAlloc(e->ctx, sizeof(double) * (size_t)n);
    for (int i = 1; i < n; i += 2) {
        long long v;
        if (!emq_parse_ll(args[i], &v) || v > (1LL << 53) || v < -(1LL << 53)) {
            (void)emq_callv(e, "ZADD", n, args); /* the server parses what the fast path won't */
            return;
        }
        sc[i] = (double)v;
    }
    RedisModuleString **av = strings_of(e, n, args);
    RedisModuleKey *k = open_write(e, av[0], REDISMODULE_KEYTYPE_ZSET);
    for (int i = 1; i < n; i += 2) RedisModule_ZsetAdd(k, sc[i], av[i + 1], NULL);
    close_key(k);
    RedisModule_Replicate(e->ctx, "ZADD", "v", av, (size_t)n);
}

long long emq_zremv(emq *e, int n, const emq_sv *args) {
    if (n < 2) return emq_int(e, emq_callv(e, "ZREM", n, args));
    RedisModuleString **av = strings_of(e, n, args);
    RedisModuleKey *k = RedisModule_OpenKey(e->ctx, av[0], REDISMODULE_READ);
    int t = RedisModule_KeyType(k);
    if (t == REDISMODULE_KEYTYPE_EMPTY) {
        close_key(k);
        return 0;
    }
    if (t != REDISMODULE_KEYTYPE_ZSET) {
        close_key(k);
        emq_fail(e, WRONGTYPE);
    }
    int present = 0;
    double score;
    for (int i = 1; i < n && !present; i++)
        present = RedisModule_ZsetScore(k, av[i], &score) == REDISMODULE_OK;
    close_key(k);
    if (!present) return 0;
    k = RedisModule_OpenKey(e->ctx, av[0], REDISMODULE_READ | REDISMODULE_WRITE);
    long long removed = 0;
    for (int i = 1; i < n; i++) {
        int deleted = 0;
        /* ZsetRem deletes the key when the set empties, as ZREM does. */
        if (RedisModule_KeyType(k) == REDISMODULE_KEYTYPE_ZSET)
            RedisModule_ZsetRem(k, av[i], &deleted);
        removed += deleted;
    }
    close_key(k);
    RedisModule_Replicate(e->ctx, "ZREM", "v", av, (size_t)n);
    return removed;
}

long long emq_delv(emq *e, int n, const emq_sv *keys) {
    if (n < 1) return emq_int(e, emq_callv(e, "DEL", n, keys));
    RedisModuleString **av = strings_of(e, n, keys);
    long long removed = 0;
    for (int i = 0; i < n; i++) {
        RedisModuleKey *k = RedisModule_OpenKey(e->ctx, av[i], REDISMODULE_READ);
        int t = RedisModule_KeyType(k);
        close_key(k);
        if (t == REDISMODULE_KEYTYPE_EMPTY) continue;
        k = RedisModule_OpenKey(e->ctx, av[i], REDISMODULE_READ | REDISMODULE_WRITE);
        RedisModule_DeleteKey(k);
        close_key(k);
        removed++;
    }
    /* DEL propagates only when it removed something (the server's dirty rule). */
    if (removed) RedisModule_Replicate(e->ctx, "DEL", "v", av, (size_t)n);
    return removed;
}

long long emq_zrem(emq *e, int n, ...) {
    emq_sv args[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) args[i] = va_arg(ap, emq_sv);
    va_end(ap);
    return emq_zremv(e, n, args);
}

long long emq_del(emq *e, int n, ...) {
    emq_sv args[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) args[i] = va_arg(ap, emq_sv);
    va_end(ap);
    return emq_delv(e, n, args);
}

long long emq_hincrby(emq *e, emq_sv key, emq_sv field, long long by) {
    emq_sv by_s = emq_fmt_ll(e, by);
    char *f = RedisModule_PoolAlloc(e->ctx, field.n + 1);
    memcpy(f, field.p, field.n);
    f[field.n] = '\0';
    const char *fields[1] = {f};
    emq_sv old[1] = {EMQ_NONE};
    long long v = 0;
    int fast = !memchr(field.p, '\0', field.n) && hash_fields(e, key, 1, fields, old);
    if (fast && old[0].p)
        fast = emq_parse_ll(old[0], &v) && emq_eq(emq_fmt_ll(e, v), old[0]);
    if (fast) fast = (by >= 0) ? v <= (1LL << 62) - by : v >= -(1LL << 62) - by;
    if (!fast) return emq_int(e, emq_call(e, "HINCRBY", 3, key, field, by_s));
    emq_sv nv = emq_fmt_ll(e, v + by);
    RedisModuleString *kn = RedisModule_CreateString(e->ctx, key.p, key.n);
    RedisModuleString *fn = RedisModule_CreateString(e->ctx, field.p, field.n);
    RedisModuleKey *k = open_write(e, kn, REDISMODULE_KEYTYPE_HASH);
    RedisModule_HashSet(k, REDISMODULE_HASH_NONE, fn,
                        RedisModule_CreateString(e->ctx, nv.p, nv.n), NULL);
    close_key(k);
    RedisModule_Replicate(e->ctx, "HINCRBY", "ssb", kn, fn, by_s.p, by_s.n);
    return v + by;
}

void emq_lset(emq *e, emq_sv key, long idx, emq_sv value) {
    RedisModuleString *kn = RedisModule_CreateString(e->ctx, key.p, key.n);
    RedisModuleString *val = RedisModule_CreateString(e->ctx, value.p, value.n);
    RedisModuleKey *k = open_write(e, kn, REDISMODULE_KEYTYPE_LIST);
    int ok = RedisModule_KeyType(k) == REDISMODULE_KEYTYPE_LIST &&
             RedisModule_ListSet(k, idx, val) == REDISMODULE_OK;
    close_key(k);
    if (!ok) {
        /* Not there any more: the server's own answer (ERR no such key / index). */
        emq_sv i = emq_fmt_ll(e, idx);
        emq_call(e, "LSET", 3, key, i, value);
        return;
    }
    char ib[24];
    int il = snprintf(ib, sizeof ib, "%ld", idx);
    RedisModule_Replicate(e->ctx, "LSET", "sbs", kn, ib, (size_t)il, val);
}

long long emq_zpopmin(emq *e, emq_sv key, long long count, emq_sv **out) {
    *out = NULL;
    if (count <= 0) return 0;
    RedisModuleString *kn = RedisModule_CreateString(e->ctx, key.p, key.n);
    RedisModuleKey *k = RedisModule_OpenKey(e->ctx, kn, REDISMODULE_READ);
    int t = RedisModule_KeyType(k);
    close_key(k);
    if (t == REDISMODULE_KEYTYPE_EMPTY) return 0;
    if (t != REDISMODULE_KEYTYPE_ZSET) emq_fail(e, WRONGTYPE);
    k = RedisModule_OpenKey(e->ctx, kn, REDISMODULE_READ | REDISMODULE_WRITE);
    long long len = (long long)RedisModule_ValueLength(k);
    long long m = count < len ? count : len;
    RedisModuleString **mem = RedisModule_PoolAlloc(e->ctx, sizeof(*mem) * (size_t)(m + 1));
    emq_sv *ids = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(m + 1));
    long long got = 0;
    /* The lowest first, ties by member, as ZPOPMIN: the score-range iterator's order. */
    RedisModule_ZsetFirstInScoreRange(k, -1.0 / 0.0, 1.0 / 0.0, 0, 0);
    while (got < m) {
        double score;
        RedisModuleString *el = RedisModule_ZsetRangeCurrentElement(k, &score);
        if (!el) break;
        mem[got] = el;
        ids[got] = pooled(e, el);
        got++;
        if (!RedisModule_ZsetRangeNext(k)) break;
    }
    RedisModule_ZsetRangeStop(k);
    for (long long i = 0; i < got; i++) {
        int deleted = 0;
        if (RedisModule_KeyType(k) == REDISMODULE_KEYTYPE_ZSET)
            RedisModule_ZsetRem(k, mem[i], &deleted);
    }
    close_key(k);
    RedisModule_Replicate(e->ctx, "ZPOPMIN", "sl", kn, count);
    *out = ids;
    return got;
}

void emq_hset(emq *e, int n, ...) {
    emq_sv args[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) args[i] = va_arg(ap, emq_sv);
    va_end(ap);
    emq_hsetv(e, n, args);
}

void emq_zadd(emq *e, int n, ...) {
    emq_sv args[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) args[i] = va_arg(ap, emq_sv);
    va_end(ap);
    emq_zaddv(e, n, args);
}

/* The server clock (D10). The scripts read TIME (sec * 1000 + usec / 1000): the same
 * wall-clock millisecond the server's own clock gives the module. */
long long emq_now_ms(emq *e) {
    (void)e;
    return RedisModule_Milliseconds();
}

/* ------------------------------------------------------------------ common.lua */

void emq_wake(emq *e, long long n) {
    if (n <= 0) return;
    if (n > 64) n = 64;
    emq_sv args[65];
    args[0] = emq_key(e, EMQ_K_WAKE);
    for (int i = 1; i <= n; i++) args[i] = EMQ_LIT("1");
    /* LPUSH, then LTRIM 0 63 past 64 entries: as pushes at the head and pops at the tail
     * through the key API, replicated as those two commands. */
    RedisModuleString **av = strings_of(e, (int)n + 1, args);
    RedisModuleKey *k = open_write(e, av[0], REDISMODULE_KEYTYPE_LIST);
    for (int i = 1; i <= n; i++) RedisModule_ListPush(k, REDISMODULE_LIST_HEAD, av[i]);
    long long len = (long long)RedisModule_ValueLength(k);
    for (long long i = len; i > 64; i--) RedisModule_ListPop(k, REDISMODULE_LIST_TAIL);
    close_key(k);
    RedisModule_Replicate(e->ctx, "LPUSH", "v", av, (size_t)n + 1);
    if (len > 64) RedisModule_Replicate(e->ctx, "LTRIM", "scc", av[0], "0", "63");
}

static double num_or0(emq_sv s) {
    /* tonumber(x or '0') for a planted value: garbage counts as 0 (the Lua would raise). */
    long long v;
    return emq_parse_ll(s, &v) ? (double)v : 0;
}

int emq_serviceable(emq *e, emq_sv g) {
    if (emq_zcard(e, emq_waiting_key(e, g)) == 0) return 0;
    if (emq_eqs(g, "*")) return 1;
    if (emq_int(e, emq_call(e, "SISMEMBER", 2, emq_key(e, EMQ_K_PAUSED), g)) == 1) return 0;
    emq_sv lim = emq_hget(e, emq_key(e, EMQ_K_GLIMIT), g);
    if (lim.p) {
        emq_sv act = emq_hget(e, emq_key(e, EMQ_K_GACTIVE), g);
        if (num_or0(act) >= num_or0(lim)) return 0;
    }
    if (emq_any_lane_rated(e) && emq_rate_blocked(e, g)) return 0;
    return 1;
}

void emq_ring_add(emq *e, emq_sv key) {
    emq_sv stale = emq_key(e, EMQ_K_RINGSTALE), inring = emq_key(e, EMQ_K_INRING);
    if (emq_int(e, emq_call(e, "SMOVE", 3, stale, inring, key)) == 1) return;
    emq_call(e, "RPUSH", 2, emq_key(e, EMQ_K_RING), key);
    emq_call(e, "SADD", 2, emq_key(e, EMQ_K_INRING), key);
}

void emq_ring_remove(emq *e, emq_sv key) {
    emq_sv ring = emq_key(e, EMQ_K_RING);
    emq_call(e, "SREM", 2, emq_key(e, EMQ_K_INRING), key);
    if (emq_scard(e, emq_key(e, EMQ_K_INRING)) == 0) {
        emq_del(e, 2, ring, emq_key(e, EMQ_K_RINGSTALE));
    } else if (emq_eq(emq_lindex(e, ring, 0), key)) {
        emq_call(e, "LPOP", 1, ring);
    } else if (emq_eq(emq_lindex(e, ring, -1), key)) {
        emq_call(e, "RPOP", 1, ring);
    } else {
        emq_call(e, "SADD", 2, emq_key(e, EMQ_K_RINGSTALE), key);
    }
}

void emq_sync(emq *e, emq_sv g, int known_inring, int *inring_out, int *inserted_out) {
    emq_sv key = g.p ? g : EMQ_FLAT;
    int flat = emq_eqs(key, "*");
    if (!flat) {
        if (emq_zcard(e, emq_waiting_key(e, key)) > 0)
            emq_call(e, "SADD", 2, emq_key(e, EMQ_K_LANES), key);
        else
            emq_call(e, "SREM", 2, emq_key(e, EMQ_K_LANES), key);
    }
    emq_sv ring = emq_key(e, EMQ_K_RING), inr = emq_key(e, EMQ_K_INRING);
    int inring = known_inring || emq_int(e, emq_call(e, "SISMEMBER", 2, inr, key)) == 1;
    if (!inring && emq_scard(e, inr) == 0 &&
        emq_llen(e, ring) > 0) {
        /* A ring written before the SETs existed: adopt its entries once. */
        RedisModuleCallReply *all = emq_call(e, "LRANGE", 3, ring, EMQ_LIT("0"), EMQ_LIT("-1"));
        size_t len = RedisModule_CallReplyLength(all);
        for (size_t i = 0; i < len; i++)
            emq_call(e, "SADD", 2, inr, emq_str(e, RedisModule_CallReplyArrayElement(all, i)));
        emq_del(e, 1, emq_key(e, EMQ_K_RINGSTALE));
        inring = emq_int(e, emq_call(e, "SISMEMBER", 2, inr, key)) == 1;
    }
    int ins = 0, live = 0;
    if (emq_serviceable(e, key)) {
        live = 1;
        if (!inring) {
            emq_ring_add(e, key);
            ins = 1;
        }
    } else {
        if (inring) emq_ring_remove(e, key);
        if (!flat && emq_zcard(e, emq_waiting_key(e, key)) > 0) {
            /* D21: a lane whose window is spent waits in ratewait for its readmission. */
            long long max, window;
            if (emq_lane_rate(e, key, &max, &window)) {
                emq_sv lk = emq_key2(e, EMQ_KP_LIMITER, key);
                if (emq_rate_left(e, lk, max) <= 0 &&
                    !emq_str(e, emq_call(e, "ZSCORE", 2, emq_key(e, EMQ_K_RATEWAIT), key)).p) {
                    long long pttl = emq_int(e, emq_call(e, "PTTL", 1, lk));
                    long long at = emq_now_ms(e) + (pttl > 1 ? pttl : 1);
                    emq_zadd(e, 3, emq_key(e, EMQ_K_RATEWAIT), emq_fmt_ll(e, at), key);
                }
            }
        }
    }
    if (inring_out) *inring_out = live;
    if (inserted_out) *inserted_out = ins;
}

void emq_touch(emq *e, emq_sv g, long long added) {
    if (!g.p && added > 0 &&
        emq_zcard(e, emq_key(e, EMQ_K_PENDING)) > added) {
        /* The flat set was non-empty before: '*' is in the ring already. */
        emq_wake(e, added);
        return;
    }
    int inring, inserted;
    emq_sync(e, g, 0, &inring, &inserted);
    if (inserted)
        emq_wake(e, emq_zcard(e, emq_waiting_key(e, g)));
    else if (inring)
        emq_wake(e, added);
}

#define RETIRED_GEN 25000

void emq_retire(emq *e, const emq_sv *pairs, int n) {
    if (n == 0) return;
    emq_sv rk = emq_key(e, EMQ_K_RETIRED);
    emq_sv args[1001];
    for (int i = 0; i < n; i += 1000) {
        int m = n - i < 1000 ? n - i : 1000;
        args[0] = rk;
        for (int j = 0; j < m; j++) args[1 + j] = pairs[i + j];
        emq_hsetv(e, m + 1, args);
    }
    /* Look at the size on a big batch, or about one small call in eight (the first id's
     * last byte: ids end in a sequence). */
    if (n < 64) {
        if (pairs[0].n == 0) emq_fail(e, "ERR empty id");
        if ((unsigned char)pairs[0].p[pairs[0].n - 1] % 8 != 0) return;
    }
    if (emq_hlen(e, rk) >= RETIRED_GEN) {
        emq_call(e, "UNLINK", 1, emq_key(e, EMQ_K_RETIRED_OLD));
        emq_call(e, "RENAME", 2, rk, emq_key(e, EMQ_K_RETIRED_OLD));
    }
}

void emq_retire_one(emq *e, emq_sv id, emq_sv attempts) {
    if (attempts.p && !emq_eqs(attempts, "0") && emq_is_digits(attempts)) {
        emq_sv pair[2] = {id, attempts};
        emq_retire(e, pair, 2);
    }
}

emq_sv emq_retired_last(emq *e, emq_sv id) {
    emq_sv v = emq_hget(e, emq_key(e, EMQ_K_RETIRED), id);
    if (v.p) return v;
    v = emq_hget(e, emq_key(e, EMQ_K_RETIRED_OLD), id);
    if (v.p) return v;
    return EMQ_LIT("0");
}

void emq_unretire(emq *e, emq_sv id) {
    emq_call(e, "HDEL", 2, emq_key(e, EMQ_K_RETIRED), id);
    emq_call(e, "HDEL", 2, emq_key(e, EMQ_K_RETIRED_OLD), id);
}

void emq_park(emq *e, emq_sv id, emq_sv jk, emq_sv g) {
    /* Scored by the row's priority (absent = 0): common.lua park. */
    emq_sv pri = emq_hget(e, jk, EMQ_LIT("priority"));
    emq_zadd(e, 3, emq_waiting_key(e, g), pri.p ? pri : EMQ_LIT("0"), id);
    emq_hset(e, 3, jk, EMQ_LIT("state"), EMQ_LIT("pending"));
}

void emq_free_slot(emq *e, emq_sv g) {
    emq_sv ga = emq_key(e, EMQ_K_GACTIVE);
    if (emq_hincrby(e, ga, g, -1) <= 0)
        emq_call(e, "HDEL", 2, ga, g);
}

long long emq_leave_active(emq *e, emq_sv id, emq_sv g) {
    long long n = emq_zrem(e, 2, emq_key(e, EMQ_K_ACTIVE), id);
    if (n == 1 && g.p) {
        emq_free_slot(e, g);
        emq_touch(e, g, 0);
    }
    return n;
}

long long emq_leave_waiting(emq *e, emq_sv id, emq_sv g) {
    long long n = emq_zrem(e, 2, emq_waiting_key(e, g), id);
    emq_sync(e, g, 0, NULL, NULL);
    return n;
}

/* ------------------------------------------------------------------ ratelimit.lua */

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

/* ------------------------------------------------------------------ observe.lua */

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

/* ------------------------------------------------------------------ fence.lua */

int emq_fence(emq *e, emq_sv jk, emq_sv token, const char *verb, int wide, emq_sv *row,
              const char **err) {
    static const char *fields[EMQ_ROW_WIDE] = {"attempts", "state",  "group",         "lease_epoch",
                                               "floor",    "dedup",  "parent",        "parent_policy",
                                               "children", "parent_queue", "flow"};
    *err = NULL;
    if (!emq_hmget(e, jk, wide ? EMQ_ROW_WIDE : EMQ_ROW, fields, row) || !row[0].p)
        return EMQ_FENCE_GONE;
    char *msg = RedisModule_PoolAlloc(e->ctx, strlen(verb) + 40);
    /* A never-claimed job holds attempts "0": "0" is never a token. */
    if (!emq_eq(row[0], token) || emq_eqs(token, "0")) {
        sprintf(msg, "EMQSTALE %s token mismatch", verb);
        *err = msg;
        return EMQ_FENCE_STALE;
    }
    if (!emq_eq(row[3], token) || (!emq_eqs(row[1], "active") && !emq_eqs(row[1], "pending"))) {
        sprintf(msg, "EMQSTALE %s lease settled", verb);
        *err = msg;
        return EMQ_FENCE_STALE;
    }
    return EMQ_FENCE_OK;
}

long long emq_release(emq *e, emq_sv id, emq_sv jk, const emq_sv row[5]) {
    /* The cancel flag ends with the lease (fence.lua release). */
    emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"), EMQ_LIT("cancel"));
    if (emq_eqs(row[1], "active")) return emq_leave_active(e, id, row[2]);
    return emq_leave_waiting(e, id, row[2]);
}

void emq_rearm(emq *e, emq_sv id, emq_sv jk, const emq_sv row[5], long long deadline) {
    if (emq_eqs(row[1], "pending")) {
        if (row[2].p) emq_hincrby(e, emq_key(e, EMQ_K_GACTIVE), row[2], 1);
        emq_leave_waiting(e, id, row[2]);
        emq_hset(e, 3, jk, EMQ_LIT("state"), EMQ_LIT("active"));
        emq_sv extra[4] = {EMQ_LIT("attempts"), row[0], EMQ_LIT("rearmed"), EMQ_LIT("1")};
        emq_emit_in(e, "active", id, row[2], 4, extra);
    }
    emq_zadd(e, 3, emq_key(e, EMQ_K_ACTIVE), emq_fmt_ll(e, deadline), id);
}

/* ------------------------------------------------------------------ control.lua */

int emq_cancel_flagged(emq *e, emq_sv jk) {
    return emq_int(e, emq_call(e, "HEXISTS", 2, jk, EMQ_LIT("cancel"))) == 1;
}

void emq_release_dedup(emq *e, emq_sv id, emq_sv jk) {
    static const char *fields[1] = {"dedup"};
    emq_sv did;
    /* pcall in the Lua: a planted non-hash row must not fail the settle that carries it. */
    if (emq_hmget(e, jk, 1, fields, &did)) emq_release_dedup_of(e, id, did);
}

void emq_release_dedup_of(emq *e, emq_sv id, emq_sv did) {
    if (!did.p) return;
    emq_sv dk = emq_key2(e, EMQ_KP_DE, did);
    if (emq_eq(emq_str(e, emq_call(e, "GET", 1, dk)), id) &&
        emq_int(e, emq_call(e, "PTTL", 1, dk)) == -1)
        emq_del(e, 1, dk);
}
