/* cmd_complete.c: EMQ.COMPLETE, the twin of complete.lua. */
#include "settle.h"
#include "commands.gen.h"

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
    emq_reply_verdict(e, v, 1);
}
