/* history.h: kept history (issue 24), the C twin of src/echomq/lua/include/history.lua and
 * common.lua's kept_parse: a queue's meta keep_completed "<count>:<age_ms>", the
 * completed row kept in emq:{q}:completed, and the trims, command for command. */
#ifndef TRAFIKEY_HISTORY_H
#define TRAFIKEY_HISTORY_H

#include "emq.h"

typedef struct {
    int on;
    int has_count, has_age;
    long long count, age;
} emq_keep;

/* kept_parse: a stored setting (absent: off). */
void emq_keep_parse(emq_sv v, emq_keep *k);
/* kept_spec(base, name): the keep_completed setting, read once per call (claim_gate seeds it). */
void emq_keep_completed_spec(emq *e, emq_keep *k);
/* keep_completed_row: state completed, finished_ms, the lease closed, ZADD completed now id. */
void emq_keep_completed_row(emq *e, emq_sv id, emq_sv jk, long long now);
/* kept_trim(base, set, spec, added, now). */
void emq_kept_trim(emq *e, const char *set, const emq_keep *k, long long added, long long now);
/* dead_letter: ZADD dead <now> id (the time of death; now <= 0 reads the clock), counted for
 * trim_dead. */
void emq_dead_letter(emq *e, emq_sv id, long long now);
/* trim_dead(base, now): bound the dead set after this call's dead-letters (keep_dead); now
 * <= 0 reads the clock. Idempotent within a call. */
void emq_trim_dead(emq *e, long long now);

#endif
