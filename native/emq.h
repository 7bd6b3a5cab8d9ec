/* emq.h: the shared layer of trafikey: the runtime (emq.c) and the C twins of
 * src/echomq/lua/include/{common,observe,fence,ratelimit,control,admit}.lua, each in its
 * namesake .c file. Every command runs inside one call frame (struct emq): the
 * parsed KEYS/ARGV, the queue base, and the per-call caches the Lua keeps in script-local
 * variables (the events bound, whether lanes are rate limited).
 *
 * Errors: a server command that fails inside a transition (WRONGTYPE on a planted key, OOM)
 * aborts the whole call, like redis.call raising inside a script: emq_fail() longjmps back
 * to emq_run(), which replies with the error text. Writes already made stay made, exactly as
 * with a script. All memory is the call's (AutoMemory + PoolAlloc), so the jump leaks nothing. */
#ifndef TRAFIKEY_EMQ_H
#define TRAFIKEY_EMQ_H

#include <setjmp.h>
#include <stddef.h>

#include "keyspace.gen.h"
#include "rmapi.h"

#define TRAFIKEY_VERSION 4

/* A byte view. p == NULL is "absent": Lua's nil/false (a missing ARGV, a nil HGET). */
typedef struct {
    const char *p;
    size_t n;
} emq_sv;

#define EMQ_LIT(s) ((emq_sv){(s), sizeof(s) - 1})
#define EMQ_NONE ((emq_sv){NULL, 0})
#define EMQ_FLAT EMQ_LIT("*")

#define EMQ_FIELDS_CACHED 32

typedef struct emq {
    RedisModuleCtx *ctx;
    emq_sv *keys; /* KEYS[1..nkeys] at keys[0..] */
    int nkeys;
    emq_sv *args; /* ARGV[1..nargs] at args[0..] */
    int nargs;
    emq_sv base; /* ARGV[1] */
    int events_known;
    emq_sv events_bound; /* absent: events off */
    int lanes_rated;     /* -1: not read yet */
    int keep_known;      /* kept history (history.h): meta keep_completed read yet */
    emq_sv keep_completed;
    int keep_dead_known; /* meta keep_dead read yet */
    emq_sv keep_dead;
    long long dead_added; /* dead-letters in this call, for trim_dead */
    emq_sv claim_stamp;   /* a claim's claimed_ms while keep_completed is set (lease.c) */
    int zdefer;           /* enqueue_many: the admissions' ZADDs wait for emq_zadd_flush */
    emq_sv zkey;
    emq_sv *zargs; /* [0] free for the key, then score member pairs */
    int zn, zcap;
    int nfields;          /* field names of the static tables made server strings (emq.c) */
    struct {
        const char *c;
        RedisModuleString *s;
    } fields[EMQ_FIELDS_CACHED];
    jmp_buf fail;
    const char *err;
} emq;

/* A transition's body: it replies itself (or fails through emq_fail). */
typedef void (*emq_body)(emq *e);

/* One form of a command: the script it twins, its body, its KEYS count and ARGV counts
 * (amin..amax, amax -1: no bound, in steps of astep). The rows are generated from the Lua
 * headers (commands.gen.h, scripts/gen-native), never written by hand. */
typedef struct {
    const char *script;
    emq_body body;
    int nkeys, amin, amax, astep;
} emq_form;

#define EMQ_FORMS_MAX 4
typedef struct {
    const char *name; /* lowercase, as registered */
    RedisModuleCmdFunc fn;
    const char *flags;
    const char *summary;
    const char *arity_error; /* the reply to counts no form takes (the scripts' shape() text) */
    int nforms;
    emq_form forms[EMQ_FORMS_MAX];
} emq_command;

/* The whole EVAL-like frame: numkeys parsing, the form whose counts fit (else the command's
 * arity error), the base/hash-tag check (every KEY must start with ARGV[1], which holds a
 * {tag}), the AutoMemory scope and the error jump. */
int emq_run(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, const emq_command *cmd);

/* ---- values ---- */
emq_sv emq_arg(emq *e, int i); /* ARGV[i], 1-based; absent past the end */
emq_sv emq_key_at(emq *e, int i); /* KEYS[i], 1-based */
int emq_eq(emq_sv a, emq_sv b);
int emq_eqs(emq_sv a, const char *lit);
int emq_has_char(emq_sv s, char c);
int emq_is_digits(emq_sv s); /* Lua '^[0-9]+$' */
int emq_parse_ll(emq_sv s, long long *out); /* a strict decimal integer that fits 64 bits */
long long emq_need_ll(emq *e, emq_sv s); /* emq_parse_ll or fail with ERR */
emq_sv emq_priority_arg(emq *e, emq_sv s); /* args.lua priority_arg: 0..2^21, canonical */
emq_sv emq_keep_logs_arg(emq *e, emq_sv s); /* args.lua keep_logs_arg: 1..MAX_ARG */
emq_sv emq_fmt_ll(emq *e, long long v);
emq_sv emq_sub(emq_sv s, long i, long j); /* Lua string.sub(s, i, j) */
emq_sv emq_cat(emq *e, int n, ...);        /* join n emq_sv */
emq_sv emq_key(emq *e, const char *suffix); /* base .. suffix */
emq_sv emq_key2(emq *e, const char *suffix, emq_sv x); /* base .. suffix .. x */
emq_sv emq_waiting_key(emq *e, emq_sv g); /* a lane's set, or pending for absent / '*' */
void emq_fail(emq *e, const char *msg) __attribute__((noreturn));
void emq_reply_sv(emq *e, emq_sv s);

/* ---- server calls (replicated as effects: RedisModule_Call with '!') ---- */
RedisModuleCallReply *emq_callv(emq *e, const char *cmd, int n, const emq_sv *args);
RedisModuleCallReply *emq_call(emq *e, const char *cmd, int n, ...);
long long emq_int(emq *e, RedisModuleCallReply *r);
emq_sv emq_str(emq *e, RedisModuleCallReply *r); /* absent for a nil reply */
/* HMGET that answers 0 for a key that is not a hash (hmget in common.lua); fields -> out. */
int emq_hmget(emq *e, emq_sv key, int n, const char **fields, emq_sv *out);
long long emq_now_ms(emq *e);

/* ---- reads through the key API (no RedisModule_Call): the same answers, and the same
 * WRONGTYPE failure, as the command named; nothing to replicate. ---- */
long long emq_exists(emq *e, emq_sv key);                       /* EXISTS key */
long long emq_card(emq *e, emq_sv key, int type);               /* ZCARD/SCARD/HLEN/LLEN */
emq_sv emq_hget(emq *e, emq_sv key, emq_sv field);              /* HGET */
void emq_hmget_strict(emq *e, emq_sv key, int n, const char **fields, emq_sv *out); /* HMGET */
/* A row read, then written, through one handle (one key lookup): emq_hrow_open is
 * emq_hmget's HMGET (0: not a hash, nothing left open) and leaves the key open for writing;
 * then exactly one of emq_hrow_hset (HSET args[0] field value ..., args[0] the same key,
 * signalled and replicated as emq_hsetv) or emq_hrow_close (nothing written), before any
 * other access to that key. */
typedef struct {
    RedisModuleString *name;
    RedisModuleKey *k;
} emq_hrow;
int emq_hrow_open(emq *e, emq_sv key, int n, const char **fields, emq_sv *out, emq_hrow *h);
void emq_hrow_hset(emq *e, emq_hrow *h, int n, RedisModuleString **av); /* av[0] set here */
void emq_hrow_hsetv(emq *e, emq_hrow *h, int n, const emq_sv *args); /* args[0]: the key */
/* EXISTS key == 0 on a write handle left open (1: absent, then emq_hrow_hset(v) or
 * emq_hrow_close), 0: it exists (nothing left open). */
int emq_hrow_open_absent(emq *e, emq_sv key, emq_hrow *h);
/* ZADD key score member, or (after emq_zadd_defer) gathered with the next ones of the same key
 * into one ZADD that emq_zadd_flush makes: the same set in the end, one key lookup and one
 * replicated command for a batch of admissions. Nothing may read the set before the flush. */
void emq_zadd_defer(emq *e);
void emq_zadd_later(emq *e, emq_sv key, emq_sv score, emq_sv member);
void emq_zadd_flush(emq *e);
/* A literal (a static table's or a string constant's: keyed by its address) as a server
 * string, made once per call. */
RedisModuleString *emq_lit_str(emq *e, const char *lit);
/* emq_hmget for a row whose fields past `narrow` are rare: when the narrow ones found plus
 * the field `also` (if present) are all the row holds, the rest are absent without a read. */
int emq_hmget_sparse(emq *e, emq_sv key, int narrow, int n, const char **fields, const char *also,
                     emq_sv *out);
void emq_hrow_close(emq_hrow *h);
emq_sv emq_lindex(emq *e, emq_sv key, long idx);                /* LINDEX */
/* ---- writes through the key API, replicated as the plain command (RedisModule_Replicate,
 * in order with the RedisModule_Call effects): args[0] is the key, then what the command
 * takes. ZADD: plain "score member" pairs, integer scores (else it goes through emq_callv). */
void emq_hsetv(emq *e, int n, const emq_sv *args);
void emq_zaddv(emq *e, int n, const emq_sv *args);
/* ZREM / DEL: the number removed; nothing is opened for writing (so no WATCH is touched)
 * and nothing replicated when there is nothing to remove, as the commands do. */
long long emq_zremv(emq *e, int n, const emq_sv *args);
long long emq_delv(emq *e, int n, const emq_sv *keys);
long long emq_zrem(emq *e, int n, ...);
long long emq_del(emq *e, int n, ...);
void emq_hset(emq *e, int n, ...);
/* HINCRBY key field by: the new value. A stored value that is not a canonical integer, or
 * an overflow, goes to the server (its own error text). */
long long emq_hincrby(emq *e, emq_sv key, emq_sv field, long long by);
/* LSET key index value (the index must exist: callers read it just before). */
void emq_lset(emq *e, emq_sv key, long idx, emq_sv value);
/* ZPOPMIN key count: the members popped (lowest first) into *out; their number. */
long long emq_zpopmin(emq *e, emq_sv key, long long count, emq_sv **out);
void emq_zadd(emq *e, int n, ...);
/* LLEN key, then LPUSH key vals... while it holds fewer than cap: at most cap - LLEN of
 * them, none on a full list (common.lua wake). */
void emq_lpush_room(emq *e, emq_sv key, int n, const emq_sv *vals, long long cap);
#define emq_zcard(e, k) emq_card((e), (k), REDISMODULE_KEYTYPE_ZSET)
#define emq_scard(e, k) emq_card((e), (k), REDISMODULE_KEYTYPE_SET)
#define emq_hlen(e, k) emq_card((e), (k), REDISMODULE_KEYTYPE_HASH)
#define emq_llen(e, k) emq_card((e), (k), REDISMODULE_KEYTYPE_LIST)

/* ---- common.lua (common.c) ---- */
void emq_wake(emq *e, long long n);
int emq_serviceable(emq *e, emq_sv g);
void emq_ring_add(emq *e, emq_sv key);
void emq_ring_remove(emq *e, emq_sv key);
void emq_sync(emq *e, emq_sv g, int known_inring, int *inring, int *inserted);
void emq_touch(emq *e, emq_sv g, long long added);
void emq_retire(emq *e, const emq_sv *pairs, int n);
void emq_retire_one(emq *e, emq_sv id, emq_sv attempts);
emq_sv emq_retired_last(emq *e, emq_sv id, int *found);
/* A minted id due now, resent within this many ms, is its own replay marker (admit.lua,
 * "the id is the marker"); the retired record keeps every retirement that long. */
#define EMQ_ID_REPLAY_MS 70000
void emq_unretire(emq *e, emq_sv id);
void emq_park(emq *e, emq_sv id, emq_sv jk, emq_sv g);
void emq_free_slot(emq *e, emq_sv g);
long long emq_leave_active(emq *e, emq_sv id, emq_sv g);
long long emq_leave_waiting(emq *e, emq_sv id, emq_sv g);
/* tally/tally_add: jobs added per waiting set, in the order first met (common.c says why);
 * emq_tally_init sizes it for at most cap keys. */
typedef struct {
    emq_sv key;
    long long n;
} emq_tally_entry;

typedef struct {
    emq_tally_entry *entry; /* in the order first met */
    int count;
    int *slot; /* index into entry, -1 = empty */
    size_t mask;
} emq_tally;

void emq_tally_init(emq *e, emq_tally *t, size_t cap);
void emq_tally_add(emq_tally *t, emq_sv key, long long by);

/* ---- ratelimit.lua (ratelimit.c) ---- */
int emq_any_lane_rated(emq *e);
int emq_lane_rate(emq *e, emq_sv g, long long *max, long long *window);
long long emq_rate_left(emq *e, emq_sv key, long long max);
int emq_rate_blocked(emq *e, emq_sv g);

/* ---- observe.lua (observe.c) ---- */
void emq_emit(emq *e, const char *event, emq_sv id, int nextra, const emq_sv *extra);
void emq_emit_in(emq *e, const char *event, emq_sv id, emq_sv g, int nextra,
                 const emq_sv *extra);
void emq_bump_metrics(emq *e, const char *kind, long long n, long long now);

/* ---- fence.lua (fence.c) ---- row = {attempts, state, group, lease_epoch, floor}; wide adds
 * {dedup, parent, parent_policy, children, parent_queue, flow} (row[5..10]) for the finishing
 * settles, so they read the row once (fence(..., wide) in the Lua). row must hold
 * EMQ_ROW_WIDE entries when wide. */
#define EMQ_FENCE_GONE 0
#define EMQ_FENCE_OK 1
#define EMQ_FENCE_STALE 2
#define EMQ_ROW 5
#define EMQ_ROW_WIDE 11
int emq_fence(emq *e, emq_sv jk, emq_sv token, const char *verb, int wide, emq_sv *row,
              const char **err);
long long emq_release(emq *e, emq_sv id, emq_sv jk, const emq_sv row[5]);
void emq_rearm(emq *e, emq_sv id, emq_sv jk, const emq_sv row[5], long long deadline);

/* ---- admit.lua (admit.c) ---- */
extern const char *const EMQ_KIND; /* the EMQKIND refusal */
emq_sv emq_verdict_sv(const char *v);
int emq_is_job(emq_sv id);
/* admit(): policy (kind) before existence (duplicate) before write; the verdict. has_run_at
 * = 0 is Lua's run_at == nil. */
const char *emq_admit(emq *e, emq_sv id, emq_sv payload, emq_sv g, int has_run_at,
                      long long run_at, long long now, int fresh, emq_sv pri, emq_sv expires,
                      emq_sv keep);
int emq_run_time(emq *e, emq_sv mode, emq_sv value, long long now, long long *run_at);
long long emq_floor_div(long long a, long long b);
emq_sv emq_marker_key(emq *e, emq_sv nonce, emq_sv rm, emq_sv second);
emq_sv emq_marker_field(emq *e, emq_sv id, emq_sv nonce);
void emq_mark_one(emq *e, emq_sv key, emq_sv field, const char *verdict, long long replay_ms,
                  int ttl);
const char *emq_find_one(emq *e, emq_sv key, emq_sv field);

/* ---- control.lua (control.c) ---- */
emq_sv emq_dedup_holder(emq *e, emq_sv did, emq_sv mode, emq_sv payload, int has_run_at,
                        long long run_at, long long now, emq_sv g, emq_sv pri, emq_sv expires,
                        emq_sv keep, emq_sv *lane_out);
void emq_take_dedup(emq *e, emq_sv id, emq_sv did, long long ttl_ms);
int emq_cancel_flagged(emq *e, emq_sv jk);
void emq_release_dedup_of(emq *e, emq_sv id, emq_sv did);
void emq_release_dedup(emq *e, emq_sv id, emq_sv jk); /* reads the row's dedup (pcall) */
/* keep_outcome: field 'result' or 'error' kept keep_ms in emq:{q}:result:<id>, waiters woken.
 * attempts absent counts as '0'. Nothing is written when keep_ms <= 0. */
void emq_keep_outcome(emq *e, emq_sv id, const char *field, emq_sv value, emq_sv attempts,
                      long long keep_ms, long long now);
/* keep_death (control.lua): a death's error kept keep_ms, else 60 s for a waiter waiting. */
void emq_keep_death(emq *e, emq_sv id, emq_sv error_text, emq_sv attempts, long long keep_ms,
                    long long now);

#endif
