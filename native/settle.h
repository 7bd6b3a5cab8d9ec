/* settle.h: the C twins of src/echomq/lua/include/settle.lua (complete_one, retry_one,
 * complete_many). EMQ.COMPLETE / EMQ.RETRY use them, and EMQ.SETTLE (the batch) reuses
 * emq_complete_many / emq_retry_one (and control.c's emq_keep_outcome, emq.h). */
#ifndef TRAFIKEY_SETTLE_H
#define TRAFIKEY_SETTLE_H

#include "emq.h"
#include "history.h"

/* A settle's verdict: text == NULL is the integer n (1 done, 0 gone), else the string text
 * (retry's 'scheduled' | 'dead' | 'removed', or an 'EMQSTALE ...' refusal). The single-job
 * commands reply an EMQ... text as an error, the batch returns it in place. */
typedef struct {
    long long n;
    const char *text;
} emq_verdict;

/* complete_one(base, id, jk, token, result): result absent = nil (a flow parent records '').
 * The caller bumps metrics:completed. */
emq_verdict emq_complete_one(emq *e, emq_sv id, emq_sv jk, emq_sv token, emq_sv result,
                             long long now, const emq_keep *keep);

/* retry_one(...): the numbers are the caller's (already parsed). keep_ms <= 0: none. */
emq_verdict emq_retry_one(emq *e, emq_sv id, emq_sv jk, emq_sv token, long long delay_ms,
                          long long max_attempts, emq_sv error_text, long long now,
                          long long keep_ms);

/* complete_many(base, args, i, count, results, now): pairs holds count (id, token) pairs
 * (2 * count entries); verdicts[count] receives one verdict per pair. results: the Lua's
 * `results` table as parallel arrays (nres entries; a later id overrides an earlier one, as
 * table assignment does), or nres == 0 for nil. Issues the batched ZREM active / DEL rows /
 * metrics:completed / retire at the end, as the Lua does. Returns how many completed. */
int emq_complete_many(emq *e, const emq_sv *pairs, int count, const emq_sv *res_ids,
                      const emq_sv *res_vals, int nres, long long now, const emq_keep *keep,
                      emq_verdict *verdicts);

void emq_reply_verdict(emq *e, emq_verdict v, int error_if_emq);

#endif
