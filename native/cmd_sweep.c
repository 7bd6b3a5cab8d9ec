/* cmd_sweep.c: EMQ.SWEEP, the twin of sweep_stalled.lua (the counted stall sweep). */
#include <string.h>

#include "flow.h"
#include "settle.h"

/* ---- the order of Lua 5.1's pairs() over the script's `added` table ----
 * touch_all iterates `added` (lane -> jobs added) with pairs(), so the lanes are touched, and
 * re-enter the ring (RPUSH), in the order of Lua 5.1's hash part. To end with the same ring
 * the sweep replays that order: a table with string keys only (no array part), filled by
 * luaH_set's rules (main position = string hash mod size; a collision takes the free slot
 * found scanning down from the end, moving the colliding node when it is not in its own main
 * position; no free slot: rehash to ceil_pow2(keys + 1) re-inserting old nodes from the last
 * one down), then walked from node 0 up as luaH_next does. The string hash is the server's
 * embedded Lua's: Lua 5.1's (seed = length) over EVERY byte (Redis patched the stock
 * step = (len >> 5) + 1 to 1 against hash flooding; measured: a 58-byte lane name orders
 * differently with the stock step). tests/test_native_settle.py checks the order against
 * pairs() itself. */

typedef struct {
    emq_sv key;
    long long n;
    int next; /* chain, -1 = none */
    int used;
} lnode;

typedef struct {
    lnode *node;
    int size; /* 0: Lua's dummynode (a table with an empty hash part) */
    int lastfree;
    emq *e;
} ltable;

static unsigned int lua_strhash(emq_sv s) {
    unsigned int h = (unsigned int)s.n;
    size_t step = 1;
    for (size_t l1 = s.n; l1 >= step; l1 -= step)
        h = h ^ ((h << 5) + (h >> 2) + (unsigned char)s.p[l1 - 1]);
    return h;
}

static int lt_main(const ltable *t, emq_sv k) {
    return (int)(lua_strhash(k) & (unsigned int)(t->size - 1));
}

static int lt_find(const ltable *t, emq_sv k) {
    if (t->size == 0) return -1;
    for (int i = lt_main(t, k); i >= 0; i = t->node[i].next)
        if (t->node[i].used && emq_eq(t->node[i].key, k)) return i;
    return -1;
}

static void lt_alloc(ltable *t, int nkeys) {
    int size = 0;
    if (nkeys > 0) {
        size = 1;
        while (size < nkeys) size <<= 1;
        t->node = RedisModule_PoolAlloc(t->e->ctx, sizeof(lnode) * (size_t)size);
        for (int i = 0; i < size; i++) t->node[i] = (lnode){EMQ_NONE, 0, -1, 0};
    } else {
        t->node = NULL;
    }
    t->size = size;
    t->lastfree = size;
}

static void lt_set(ltable *t, emq_sv k, long long n);

static void lt_newkey(ltable *t, emq_sv k, long long n) {
    int mp = t->size ? lt_main(t, k) : -1;
    if (mp < 0 || t->node[mp].used) {
        int fr = -1;
        while (t->lastfree-- > 0) {
            if (!t->node[t->lastfree].used) {
                fr = t->lastfree;
                break;
            }
        }
        if (fr < 0) {
            /* rehash: every old key plus this one, re-inserted from the last node down. */
            lnode *old = t->node;
            int oldsize = t->size, count = 1;
            for (int i = 0; i < oldsize; i++) count += old[i].used;
            lt_alloc(t, count);
            for (int i = oldsize - 1; i >= 0; i--)
                if (old[i].used) lt_set(t, old[i].key, old[i].n);
            lt_set(t, k, n);
            return;
        }
        int othern = lt_main(t, t->node[mp].key);
        if (othern != mp) {
            /* The colliding node is out of its main position: it moves to the free slot. */
            while (t->node[othern].next != mp) othern = t->node[othern].next;
            t->node[othern].next = fr;
            t->node[fr] = t->node[mp];
            t->node[mp] = (lnode){EMQ_NONE, 0, -1, 0};
        } else {
            t->node[fr].next = t->node[mp].next;
            t->node[mp].next = fr;
            mp = fr;
        }
    }
    t->node[mp].key = k;
    t->node[mp].n = n;
    t->node[mp].used = 1;
}

static void lt_set(ltable *t, emq_sv k, long long n) {
    int i = lt_find(t, k);
    if (i >= 0)
        t->node[i].n = n;
    else
        lt_newkey(t, k, n);
}

static void lt_add(ltable *t, emq_sv k, long long by) {
    int i = lt_find(t, k);
    lt_set(t, k, (i >= 0 ? t->node[i].n : 0) + by);
}

/* ---- the sweep ---- */

/* redis.pcall('HINCRBY', jk, 'stalled', 1): 0 when it answers an error (nothing written). */
static int pcall_hincrby(emq *e, emq_sv jk, long long *out) {
    RedisModuleString *av[3] = {RedisModule_CreateString(e->ctx, jk.p, jk.n),
                                RedisModule_CreateString(e->ctx, "stalled", 7),
                                RedisModule_CreateString(e->ctx, "1", 1)};
    RedisModuleCallReply *r = RedisModule_Call(e->ctx, "HINCRBY", "!v", av, (size_t)3);
    if (!r || RedisModule_CallReplyType(r) != REDISMODULE_REPLY_INTEGER) return 0;
    *out = RedisModule_CallReplyInteger(r);
    return 1;
}

/* KEYS active, dead; ARGV base max_stalled limit. Returns {{recovered...}, {dead...}}. */
static void sweep(emq *e) {
    long long max_stalled = emq_need_ll(e, emq_arg(e, 2));
    emq_sv limit = emq_fmt_ll(e, emq_need_ll(e, emq_arg(e, 3)));
    long long now = emq_now_ms(e);
    emq_sv active = emq_key_at(e, 1), dead = emq_key_at(e, 2);
    RedisModuleCallReply *lapsed = emq_call(e, "ZRANGEBYSCORE", 6, active, EMQ_LIT("-inf"),
                                            emq_fmt_ll(e, now), EMQ_LIT("LIMIT"), EMQ_LIT("0"), limit);
    size_t len = RedisModule_CallReplyLength(lapsed);
    emq_sv *ids = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (len + 1));
    for (size_t i = 0; i < len; i++) ids[i] = emq_str(e, RedisModule_CallReplyArrayElement(lapsed, i));
    emq_sv *recovered = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (len + 1));
    emq_sv *died = RedisModule_PoolAlloc(e->ctx, sizeof(emq_sv) * (len + 1));
    int nrec = 0, ndied = 0;
    ltable added = {NULL, 0, 0, e};
    static const char *fields[3] = {"state", "group", "attempts"};
    for (size_t i = 0; i < len; i++) {
        emq_sv id = ids[i], jk = emq_key2(e, "job:", id);
        emq_zrem(e, 2, active, id);
        emq_sv row[3] = {EMQ_NONE, EMQ_NONE, EMQ_NONE};
        if (!emq_hmget(e, jk, 3, fields, row)) row[0] = row[1] = row[2] = EMQ_NONE;
        emq_sv g = row[1];
        if (g.p) {
            emq_free_slot(e, g);
            lt_add(&added, g, 0);
        }
        if (!row[0].p) continue;
        /* A stall count that is not an integer restarts at this stall (no error midway: the
         * ZREM above is made, the job must land in a set). */
        long long stalled;
        if (!pcall_hincrby(e, jk, &stalled)) {
            stalled = 1;
            emq_hset(e, 3, jk, EMQ_LIT("stalled"), EMQ_LIT("1"));
        }
        emq_sv st = emq_fmt_ll(e, stalled);
        if (stalled >= max_stalled) {
            emq_hset(e, 5, jk, EMQ_LIT("state"), EMQ_LIT("dead"), EMQ_LIT("last_error"),
                     EMQ_LIT("stalled"));
            emq_call(e, "HDEL", 2, jk, EMQ_LIT("lease_epoch"));
            emq_zadd(e, 3, dead, EMQ_LIT("0"), id);
            emq_bump_metrics(e, "failed", 1, now);
            emq_sv extra[4] = {EMQ_LIT("error"), EMQ_LIT("stalled"), EMQ_LIT("stalled"), st};
            emq_emit_in(e, "dead", id, g, 4, extra);
            emq_release_dedup(e, id, jk);
            emq_flow flow;
            if (emq_flow_parent(e, jk, &flow)) emq_flow_child_dead(e, id, &flow, EMQ_LIT("stalled"));
            /* D17: the row holds no keep time; as cancel does, "stalled" is kept 60 s, only for
             * a waiter already waiting. */
            if (emq_exists(e, emq_key2(e, "want:", id)) == 1)
                emq_keep_outcome(e, id, "error", EMQ_LIT("stalled"), row[2], 60000, now);
            died[ndied++] = id;
        } else {
            emq_park(e, id, jk, g);
            emq_sv extra[2] = {EMQ_LIT("stalled"), st};
            emq_emit_in(e, "stalled", id, g, 2, extra);
            lt_add(&added, g.p ? g : EMQ_FLAT, 1);
            recovered[nrec++] = id;
        }
    }
    /* touch_all: every lane that lost an active job is synced, in pairs() order (above). */
    for (int i = 0; i < added.size; i++) {
        lnode *nd = &added.node[i];
        if (!nd->used) continue;
        emq_touch(e, emq_eqs(nd->key, "*") ? EMQ_NONE : nd->key, nd->n);
    }
    RedisModule_ReplyWithArray(e->ctx, 2);
    RedisModule_ReplyWithArray(e->ctx, nrec);
    for (int i = 0; i < nrec; i++) emq_reply_sv(e, recovered[i]);
    RedisModule_ReplyWithArray(e->ctx, ndied);
    for (int i = 0; i < ndied; i++) emq_reply_sv(e, died[i]);
}

emq_body emq_sweep_shape(int nkeys, int nargs, const char **why) {
    if (nkeys == 2 && nargs == 3) return sweep;
    *why = "ERR EMQ.SWEEP takes 2 keys (active, dead) and 3 args (base, max_stalled, limit)";
    return NULL;
}
