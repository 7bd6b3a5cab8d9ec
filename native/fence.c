/* fence.c: the twin of src/echomq/lua/include/fence.lua (see emq.h): the D5 fence (fence,
 * release, rearm). Each function names the Lua helper it mirrors and issues its commands in
 * the same order. */
#include "emq.h"

#include <stdio.h>
#include <string.h>

int emq_fence(emq *e, emq_sv jk, emq_sv token, const char *verb, int wide, emq_sv *row,
              const char **err) {
    static const char *fields[EMQ_ROW_WIDE] = {"attempts", "state",  "group",         "lease_epoch",
                                               "floor",    "dedup",  "parent",        "parent_policy",
                                               "children", "parent_queue", "flow"};
    *err = NULL;
    /* The wide fields (flows, dedup) are rare: a row holding only the narrow ones and its
     * payload has none of them, and they are not looked up one by one (emq_hmget_sparse). */
    int hash = wide ? emq_hmget_sparse(e, jk, EMQ_ROW, EMQ_ROW_WIDE, fields, "payload", row)
                    : emq_hmget(e, jk, EMQ_ROW, fields, row);
    if (!hash || !row[0].p) return EMQ_FENCE_GONE;
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
