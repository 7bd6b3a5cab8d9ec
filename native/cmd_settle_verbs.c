/* cmd_settle_verbs.c: EMQ.COMPLETE (complete.lua) and EMQ.RETRY (retry.lua). */
#include "settle.h"
#include "commands.gen.h"

#include <string.h>

static void reply_verdict(emq *e, emq_verdict v, int error_if_emq) {
    if (!v.text) {
        RedisModule_ReplyWithLongLong(e->ctx, v.n);
    } else if (error_if_emq && v.text[0] == 'E' && v.text[1] == 'M' && v.text[2] == 'Q') {
        RedisModule_ReplyWithError(e->ctx, v.text);
    } else {
        RedisModule_ReplyWithStringBuffer(e->ctx, v.text, strlen(v.text));
    }
}

/* complete.lua: KEYS active, row; ARGV base id token result [keep_result_ms]. */
void emq_cmd_complete(emq *e) {
    /* keep_result_ms is checked before anything is written (the Lua's tonumber would raise
     * after the completion on a malformed value). */
    long long keep = e->nargs >= 5 ? emq_need_ll(e, emq_arg(e, 5)) : 0;
    emq_sv id = emq_arg(e, 2), token = emq_arg(e, 3), result = emq_arg(e, 4);
    long long now = emq_now_ms(e);
    emq_keep kept; /* kept history (history.h): the row stays while the queue asks */
    emq_keep_completed_spec(e, &kept);
    emq_verdict v = emq_complete_one(e, id, emq_key_at(e, 2), token, result, now, &kept);
    if (!v.text && v.n == 1) {
        emq_bump_metrics(e, "completed", 1, now);
        if (keep > 0) emq_keep_outcome(e, id, "result", result, token, keep, now);
        if (kept.on) emq_kept_trim(e, "completed", &kept, 1, now);
    }
    /* Every text complete_one returns is an EMQSTALE refusal: an error reply. */
    reply_verdict(e, v, 1);
}

/* retry.lua: KEYS active, schedule, dead, row; ARGV base id token delay_ms max_attempts
 * error [keep_ms]. The numbers are checked before the fence (see README: a gone job with a
 * malformed number answers ERR here, 0 in the Lua). */
void emq_cmd_retry(emq *e) {
    long long delay = emq_need_ll(e, emq_arg(e, 4));
    long long max = emq_need_ll(e, emq_arg(e, 5));
    long long keep = e->nargs >= 7 ? emq_need_ll(e, emq_arg(e, 7)) : 0;
    long long now = emq_now_ms(e);
    emq_verdict v = emq_retry_one(e, emq_arg(e, 2), emq_key_at(e, 4), emq_arg(e, 3), delay, max,
                                  emq_arg(e, 6), now, keep);
    emq_trim_dead(e, now); /* keep_dead (history.h) */
    reply_verdict(e, v, 1);
}
