/* cmd_retry.c: EMQ.RETRY, the twin of retry.lua. */
#include "settle.h"
#include "commands.gen.h"

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
    emq_reply_verdict(e, v, 1);
}
