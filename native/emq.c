/* emq.c: the runtime every command stands on (see emq.h): the EVAL-like frame with the shape
 * and argument checks of include/args.lua, values, server calls and the key API. The twins of
 * the other includes are their namesakes: common.c, ratelimit.c, observe.c, fence.c,
 * control.c, admit.c, compose.c, lease.c, settle.c, history.c (tests/test_key_suffixes.py
 * keeps the mirror). */
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

/* args.lua priority_arg: an integer argument in 0..2^21, or the refusal. The Lua stores the
 * number, so the text stored is its canonical decimal (a leading zero or '-0' is folded). */
emq_sv emq_priority_arg(emq *e, emq_sv s) {
    long long p = emq_need_ll(e, s);
    if (p < 0 || p > 2097152) emq_fail(e, "ERR priority must be 0..2097152");
    return emq_fmt_ll(e, p);
}

/* args.lua keep_logs_arg: an integer argument in 1..MAX_ARG (15 digits), as canonical text
 * (the Lua stores string.format('%d', n)). */
emq_sv emq_keep_logs_arg(emq *e, emq_sv s) {
    long long n = emq_need_ll(e, s);
    if (n < 1) emq_fail(e, "ERR keep_logs must be 1..999999999999999");
    return emq_fmt_ll(e, n);
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

static RedisModuleString *mkstr(emq *e, emq_sv s) {
    return RedisModule_CreateString(e->ctx, s.p, s.n);
}

/* A read handle; NULL (type EMPTY) when the key does not exist. The caller closes it
 * before any later write through RedisModule_Call can touch the same key. */
static RedisModuleKey *open_read(emq *e, emq_sv key) {
    return RedisModule_OpenKey(e->ctx, mkstr(e, key), REDISMODULE_READ);
}

static void close_key(RedisModuleKey *k) {
    if (k) RedisModule_CloseKey(k);
}

/* The module signals what it wrote (trafikey.c sets NO_IMPLICIT_SIGNAL_MODIFIED): WATCH and
 * client-side caching see a key-API write as they see the command's, and a key only read
 * (also through a write handle) is left alone. */
static void signal_key(emq *e, RedisModuleString *name) {
    RedisModule_SignalModifiedKey(e->ctx, name);
}

/* The value of a returned string: a view of it. Strings the key API returns are the call's
 * (AutoMemory) and nothing frees them before the call ends, so no copy is made. */
static emq_sv view(RedisModuleString *s) {
    if (!s) return EMQ_NONE;
    emq_sv v;
    v.p = RedisModule_StringPtrLen(s, &v.n);
    if (!v.p) v.p = "";
    return v;
}

/* A field name of the static tables as a server string, made once per call: HashGet with
 * C-string fields would build (and free) one per field per read. */
static RedisModuleString *field_str(emq *e, const char *f) {
    for (int i = 0; i < e->nfields; i++)
        if (e->fields[i].c == f) return e->fields[i].s;
    RedisModuleString *s = RedisModule_CreateString(e->ctx, f, strlen(f));
    if (e->nfields < EMQ_FIELDS_CACHED) {
        e->fields[e->nfields].c = f;
        e->fields[e->nfields].s = s;
        e->nfields++;
    }
    return s;
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

/* n fields of the hash open at k (NULL: absent, every out EMQ_NONE). */
static void read_fields(emq *e, RedisModuleKey *k, int n, const char **fields, emq_sv *out) {
    for (int i = 0; i < n; i++) {
        RedisModuleString *v = NULL;
        if (k) RedisModule_HashGet(k, REDISMODULE_HASH_NONE, field_str(e, fields[i]), &v, NULL);
        out[i] = view(v);
    }
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
    read_fields(e, k, n, fields, out);
    close_key(k);
    return 1;
}

int emq_hmget_sparse(emq *e, emq_sv key, int narrow, int n, const char **fields, const char *also,
                     emq_sv *out) {
    RedisModuleKey *k = open_read(e, key);
    int t = RedisModule_KeyType(k);
    if (t != REDISMODULE_KEYTYPE_EMPTY && t != REDISMODULE_KEYTYPE_HASH) {
        close_key(k);
        return 0;
    }
    read_fields(e, k, narrow, fields, out);
    size_t seen = 0;
    for (int i = 0; i < narrow; i++) seen += out[i].p != NULL;
    if (k && seen < RedisModule_ValueLength(k)) {
        int has = 0;
        RedisModule_HashGet(k, REDISMODULE_HASH_EXISTS, field_str(e, also), &has, NULL);
        seen += has != 0;
    }
    /* Every field of the row is accounted for: the others are absent, unread. */
    if (!k || seen == RedisModule_ValueLength(k))
        for (int i = narrow; i < n; i++) out[i] = EMQ_NONE;
    else
        read_fields(e, k, n - narrow, fields + narrow, out + narrow);
    close_key(k);
    return 1;
}

emq_sv emq_hget(emq *e, emq_sv key, emq_sv field) {
    RedisModuleKey *k = open_read(e, key);
    int t = RedisModule_KeyType(k);
    if (t != REDISMODULE_KEYTYPE_EMPTY && t != REDISMODULE_KEYTYPE_HASH) {
        close_key(k);
        emq_fail(e, WRONGTYPE);
    }
    RedisModuleString *v = NULL;
    if (k) RedisModule_HashGet(k, REDISMODULE_HASH_NONE, mkstr(e, field), &v, NULL);
    close_key(k);
    return view(v);
}

void emq_hmget_strict(emq *e, emq_sv key, int n, const char **fields, emq_sv *out) {
    if (!hash_fields(e, key, n, fields, out)) emq_fail(e, WRONGTYPE);
}

int emq_hmget(emq *e, emq_sv key, int n, const char **fields, emq_sv *out) {
    /* redis.pcall in the Lua: a planted non-hash key answers "no row", it fails nothing. */
    return hash_fields(e, key, n, fields, out);
}

int emq_hrow_open(emq *e, emq_sv key, int n, const char **fields, emq_sv *out, emq_hrow *h) {
    h->name = mkstr(e, key);
    h->k = RedisModule_OpenKey(e->ctx, h->name, REDISMODULE_READ | REDISMODULE_WRITE);
    int t = RedisModule_KeyType(h->k);
    if (t != REDISMODULE_KEYTYPE_EMPTY && t != REDISMODULE_KEYTYPE_HASH) {
        emq_hrow_close(h);
        return 0;
    }
    read_fields(e, t == REDISMODULE_KEYTYPE_EMPTY ? NULL : h->k, n, fields, out);
    return 1;
}

void emq_hrow_close(emq_hrow *h) {
    close_key(h->k);
    h->k = NULL;
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
            v = view(RedisModule_ListGet(k, idx));
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
 * otherwise, as the command would answer. The caller signals the key once it wrote it. */
static RedisModuleKey *open_write(emq *e, RedisModuleString *name, int type) {
    RedisModuleKey *k = RedisModule_OpenKey(e->ctx, name, REDISMODULE_READ | REDISMODULE_WRITE);
    int t = RedisModule_KeyType(k);
    if (t != REDISMODULE_KEYTYPE_EMPTY && t != type) {
        close_key(k);
        emq_fail(e, WRONGTYPE);
    }
    return k;
}

/* HSET args[0] field value ...: on the open handle k of the key av[0] (closed here). */
static void hset_on(emq *e, RedisModuleKey *k, int n, RedisModuleString **av) {
    for (int i = 1; i < n; i += 2)
        RedisModule_HashSet(k, REDISMODULE_HASH_NONE, av[i], av[i + 1], NULL);
    close_key(k);
    signal_key(e, av[0]);
    RedisModule_Replicate(e->ctx, "HSET", "v", av, (size_t)n);
}

void emq_hsetv(emq *e, int n, const emq_sv *args) {
    if (n < 3 || n % 2 == 0) {
        (void)emq_callv(e, "HSET", n, args); /* the server's own arity error */
        return;
    }
    RedisModuleString **av = strings_of(e, n, args);
    hset_on(e, open_write(e, av[0], REDISMODULE_KEYTYPE_HASH), n, av);
}

void emq_hrow_hset(emq *e, emq_hrow *h, int n, RedisModuleString **av) {
    av[0] = h->name;
    RedisModuleKey *k = h->k;
    h->k = NULL;
    hset_on(e, k, n, av);
}

void emq_hrow_hsetv(emq *e, emq_hrow *h, int n, const emq_sv *args) {
    emq_hrow_hset(e, h, n, strings_of(e, n, args));
}

int emq_hrow_open_absent(emq *e, emq_sv key, emq_hrow *h) {
    h->name = mkstr(e, key);
    h->k = RedisModule_OpenKey(e->ctx, h->name, REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_KeyType(h->k) == REDISMODULE_KEYTYPE_EMPTY) return 1;
    emq_hrow_close(h);
    return 0;
}

RedisModuleString *emq_lit_str(emq *e, const char *lit) { return field_str(e, lit); }

/* ---- the admissions' ZADDs of one EMQ.ENQUEUE (many form): one ZADD per key, at the end */

void emq_zadd_defer(emq *e) {
    e->zdefer = 1;
    e->zn = 0;
}

void emq_zadd_flush(emq *e) {
    if (e->zn > 0) {
        e->zargs[0] = e->zkey;
        emq_zaddv(e, e->zn + 1, e->zargs);
    }
    e->zn = 0;
}

void emq_zadd_later(emq *e, emq_sv key, emq_sv score, emq_sv member) {
    long long v;
    int fast = emq_parse_ll(score, &v) && v <= (1LL << 53) && v >= -(1LL << 53);
    if (e->zdefer && fast && e->zn > 0 && !emq_eq(e->zkey, key)) emq_zadd_flush(e);
    if (e->zdefer && fast && e->zn == 0) {
        /* Deferred only onto a set (or no key): a planted key of another type fails this
         * ZADD now, where the script's first ZADD fails, after the same writes. */
        RedisModuleKey *k = open_read(e, key);
        int t = RedisModule_KeyType(k);
        close_key(k);
        if (t != REDISMODULE_KEYTYPE_EMPTY && t != REDISMODULE_KEYTYPE_ZSET) fast = 0;
        else e->zkey = key;
    }
    if (!e->zdefer || !fast) {
        emq_zadd(e, 3, key, score, member);
        return;
    }
    if (1 + e->zn + 2 > e->zcap) {
        int cap = e->zcap ? e->zcap * 2 : 64;
        emq_sv *grown = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)cap);
        if (e->zn) memcpy(grown + 1, e->zargs + 1, sizeof(emq_sv) * (size_t)e->zn);
        e->zargs = grown;
        e->zcap = cap;
    }
    e->zargs[1 + e->zn++] = score;
    e->zargs[1 + e->zn++] = member;
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
    signal_key(e, av[0]);
    RedisModule_Replicate(e->ctx, "ZADD", "v", av, (size_t)n);
}

long long emq_zremv(emq *e, int n, const emq_sv *args) {
    if (n < 2) return emq_int(e, emq_callv(e, "ZREM", n, args));
    RedisModuleString **av = strings_of(e, n, args);
    RedisModuleKey *k = RedisModule_OpenKey(e->ctx, av[0], REDISMODULE_READ | REDISMODULE_WRITE);
    int t = RedisModule_KeyType(k);
    if (t == REDISMODULE_KEYTYPE_EMPTY) {
        close_key(k);
        return 0;
    }
    if (t != REDISMODULE_KEYTYPE_ZSET) {
        close_key(k);
        emq_fail(e, WRONGTYPE);
    }
    long long removed = 0;
    for (int i = 1; i < n; i++) {
        int deleted = 0;
        /* ZsetRem deletes the key when the set empties, as ZREM does. */
        if (RedisModule_KeyType(k) == REDISMODULE_KEYTYPE_ZSET)
            RedisModule_ZsetRem(k, av[i], &deleted);
        removed += deleted;
    }
    close_key(k);
    /* Nothing removed: nothing signalled or replicated, as ZREM (the server's dirty rule). */
    if (!removed) return 0;
    signal_key(e, av[0]);
    RedisModule_Replicate(e->ctx, "ZREM", "v", av, (size_t)n);
    return removed;
}

long long emq_delv(emq *e, int n, const emq_sv *keys) {
    if (n < 1) return emq_int(e, emq_callv(e, "DEL", n, keys));
    RedisModuleString **av = strings_of(e, n, keys);
    long long removed = 0;
    for (int i = 0; i < n; i++) {
        RedisModuleKey *k =
            RedisModule_OpenKey(e->ctx, av[i], REDISMODULE_READ | REDISMODULE_WRITE);
        if (RedisModule_KeyType(k) == REDISMODULE_KEYTYPE_EMPTY) {
            close_key(k);
            continue;
        }
        RedisModule_DeleteKey(k);
        close_key(k);
        signal_key(e, av[i]);
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
    RedisModuleString *kn = mkstr(e, key), *fn = mkstr(e, field);
    /* One write handle reads the old value and writes the new one: a key of another type
     * is the WRONGTYPE HINCRBY answers. */
    RedisModuleKey *k = open_write(e, kn, REDISMODULE_KEYTYPE_HASH);
    RedisModuleString *old = NULL;
    if (RedisModule_KeyType(k) == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(k, REDISMODULE_HASH_NONE, fn, &old, NULL);
    long long v = 0;
    int fast = 1;
    if (old) {
        emq_sv o = view(old);
        fast = emq_parse_ll(o, &v) && emq_eq(emq_fmt_ll(e, v), o);
    }
    if (fast) fast = (by >= 0) ? v <= (1LL << 62) - by : v >= -(1LL << 62) - by;
    emq_sv by_s = emq_fmt_ll(e, by);
    if (!fast) {
        close_key(k);
        return emq_int(e, emq_call(e, "HINCRBY", 3, key, field, by_s));
    }
    emq_sv nv = emq_fmt_ll(e, v + by);
    RedisModule_HashSet(k, REDISMODULE_HASH_NONE, fn, mkstr(e, nv), NULL);
    close_key(k);
    signal_key(e, kn);
    RedisModule_Replicate(e->ctx, "HINCRBY", "ssb", kn, fn, by_s.p, by_s.n);
    return v + by;
}

void emq_lset(emq *e, emq_sv key, long idx, emq_sv value) {
    RedisModuleString *kn = mkstr(e, key);
    RedisModuleString *val = mkstr(e, value);
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
    signal_key(e, kn);
    char ib[24];
    int il = snprintf(ib, sizeof ib, "%ld", idx);
    RedisModule_Replicate(e->ctx, "LSET", "sbs", kn, ib, (size_t)il, val);
}

long long emq_zpopmin(emq *e, emq_sv key, long long count, emq_sv **out) {
    *out = NULL;
    if (count <= 0) return 0;
    RedisModuleString *kn = mkstr(e, key);
    RedisModuleKey *k = RedisModule_OpenKey(e->ctx, kn, REDISMODULE_READ | REDISMODULE_WRITE);
    int t = RedisModule_KeyType(k);
    if (t == REDISMODULE_KEYTYPE_EMPTY) {
        close_key(k);
        return 0;
    }
    if (t != REDISMODULE_KEYTYPE_ZSET) {
        close_key(k);
        emq_fail(e, WRONGTYPE);
    }
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
        ids[got] = view(el);
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
    signal_key(e, kn);
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

/* LLEN key, then LPUSH key vals... while it holds fewer than cap (at most cap - LLEN of them):
 * pushes at the head through the key API, replicated as one LPUSH; a full list gets none. */
void emq_lpush_room(emq *e, emq_sv key, int n, const emq_sv *vals, long long cap) {
    /* The length first, on a read handle: a full list is left untouched (no write, nothing
     * signalled or replicated). */
    long long room = cap - emq_llen(e, key);
    if (room <= 0) return;
    if (n > room) n = (int)room;
    emq_sv *args = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (size_t)(n + 1));
    args[0] = key;
    for (int i = 0; i < n; i++) args[i + 1] = vals[i];
    RedisModuleString **av = strings_of(e, n + 1, args);
    RedisModuleKey *k = open_write(e, av[0], REDISMODULE_KEYTYPE_LIST);
    for (int i = 1; i <= n; i++) RedisModule_ListPush(k, REDISMODULE_LIST_HEAD, av[i]);
    close_key(k);
    signal_key(e, av[0]);
    RedisModule_Replicate(e->ctx, "LPUSH", "v", av, (size_t)n + 1);
}

/* The server clock (D10). The scripts read TIME (sec * 1000 + usec / 1000): the same
 * wall-clock millisecond the server's own clock gives the module. */
long long emq_now_ms(emq *e) {
    (void)e;
    return RedisModule_Milliseconds();
}
