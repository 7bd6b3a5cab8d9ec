/* cmd_reprocess.c: EMQ.REPROCESS, the twin of reprocess.lua: dead or a kept completed row ->
 * pending (its lane), or -> schedule with a run time (issue 24). */
#include "emq.h"
#include "commands.gen.h"

/* KEYS row, dead; ARGV base id [in|at ms]. */
void emq_cmd_reprocess(emq *e) {
    emq_sv id = emq_arg(e, 2), jk = emq_key_at(e, 1), mode = emq_arg(e, 3);
    long long ms = 0;
    if (mode.p) {
        if (!emq_eqs(mode, "in") && !emq_eqs(mode, "at"))
            emq_fail(e, "ERR EMQ.REPROCESS mode must be in or at");
        ms = emq_need_ll(e, emq_arg(e, 4));
    }
    if (emq_exists(e, jk) == 0) {
        RedisModule_ReplyWithLongLong(e->ctx, 0);
        return;
    }
    static const char *fields[2] = {"group", "attempts"};
    emq_sv row[2];
    if (!emq_hmget(e, jk, 2, fields, row)) {
        RedisModule_ReplyWithError(e->ctx, "EMQSTATE not a job row");
        return;
    }
    if (emq_zrem(e, 2, emq_key_at(e, 2), id) == 0 &&
        emq_zrem(e, 2, emq_key(e, EMQ_K_COMPLETED), id) == 0) {
        RedisModule_ReplyWithError(e->ctx, "EMQSTATE not dead or completed");
        return;
    }
    emq_sv g = row[0];
    /* expires (issue 24): a reprocess starts without the first claim's deadline. */
    emq_call(e, "HDEL", 8, jk, EMQ_LIT("last_error"), EMQ_LIT("stalled"), EMQ_LIT("cancel"),
             EMQ_LIT("progress"), EMQ_LIT("finished_ms"), EMQ_LIT("claimed_ms"),
             EMQ_LIT("expires"));
    /* A new incarnation: the previous one's kept outcome and wake token go (reprocess.lua). */
    emq_del(e, 2, emq_key2(e, EMQ_KP_RESULT, id), emq_key2(e, EMQ_KP_NOTIFY, id));
    if (row[1].p && !emq_eqs(row[1], "0") && emq_is_digits(row[1]))
        emq_hset(e, 3, jk, EMQ_LIT("floor"), row[1]);
    if (mode.p) {
        long long now = emq_now_ms(e), run_at = emq_eqs(mode, "in") ? now + ms : ms;
        if (run_at > now) {
            emq_sv at = emq_fmt_ll(e, run_at);
            emq_hset(e, 3, jk, EMQ_LIT("state"), EMQ_LIT("scheduled"));
            emq_zadd(e, 3, emq_key(e, EMQ_K_SCHEDULE), at, id);
            emq_sv extra[2] = {EMQ_LIT("run_at"), at};
            emq_emit_in(e, "reprocessed", id, g, 2, extra);
            RedisModule_ReplyWithLongLong(e->ctx, 1);
            return;
        }
    }
    emq_park(e, id, jk, g);
    emq_touch(e, g, 1);
    emq_emit_in(e, "reprocessed", id, g, 0, NULL);
    RedisModule_ReplyWithLongLong(e->ctx, 1);
}
