/* lease.h: the claim core, the C twin of src/echomq/lua/include/lease.lua (and the claim gate
 * and queue-wide limits it reads: common.c, ratelimit.c), shared by EMQ.CLAIM (cmd_claim.c) and, later, EMQ.SETTLE. Names carry the
 * emq_ prefix of the Lua function they mirror; the command order follows the Lua so the
 * keyspace and the replicated effects end identical. */
#ifndef TRAFIKEY_LEASE_H
#define TRAFIKEY_LEASE_H

#include "emq.h"

/* One claimed job, as lease_many appends it: {id, payload, attempts, group|false[, floor]}.
 * group.p == NULL is the flat set (false in the Lua); floor.p == NULL: the row has none. */
typedef struct {
    emq_sv id;
    emq_sv payload;
    long long attempts;
    emq_sv group;
    emq_sv floor;
} emq_job;

/* The claim's out list plus the script-local cache the Lua keeps for queue_rate (ratelimit.lua
 * qrate): qrate_known 0 is "not read yet" (claim_n then reads meta itself, as queue_rate
 * does); emq_claim_gate seeds it. Start from emq_lease_init. */
typedef struct {
    emq_job *jobs;
    long long n, cap;
    int qrate_known;
    int qrated; /* a queue-wide limit is set */
    long long qmax, qwindow;
    int qlimit_known, qlimited; /* the queue-wide concurrency limit (meta limit), read once */
    long long qlimit;
} emq_lease;

void emq_lease_init(emq_lease *out);

/* lease.lua claim_n: claim up to n jobs on `deadline`, appended to out; returns how many. */
long long emq_claim_n(emq *e, long long deadline, long long n, emq_lease *out, long long now);

/* lease.lua rate_wait: the ms until a rate limit lets a claim take something, 0 when none
 * holds anything back. emq_rate_wait reads the queue rate itself (one HMGET of meta);
 * emq_rate_wait_in uses the cache of a lease that claim_gate or claim_n filled. */
long long emq_rate_wait(emq *e, long long now);
long long emq_rate_wait_in(emq *e, long long now, emq_lease *cache);

/* common.lua claim_gate (common.c): one HMGET of meta seeds the events bound, the lanes-rated flag and
 * the queue rate (into out); returns 1 when the queue is paused. */
int emq_claim_gate(emq *e, emq_lease *out);

/* ratelimit.lua (ratelimit.c), the queue-wide limits on a lease's cache: seed_queue_rate and
 * seed_limit from meta's fields, queue_rate reads them once, limit_room caps n by the
 * concurrency limit's room, rate_charge counts n claims against a limiter key. */
void emq_seed_queue_rate(emq_lease *c, emq_sv max, emq_sv window);
void emq_queue_rate(emq *e, emq_lease *c);
void emq_rate_charge(emq *e, emq_sv key, long long n, long long window);
void emq_seed_limit(emq_lease *c, emq_sv lim);
long long emq_limit_room(emq *e, emq_lease *c, long long n);

/* now + lease_ms, or ERR when it would overflow (cmd_claim.c, cmd_claim_batch.c). */
long long emq_deadline_of(emq *e, long long now, long long lease);

/* The reply of one claimed job: a 4 or 5 element array (the Lua table's RESP form). */
void emq_reply_job(emq *e, const emq_job *j);

#endif
