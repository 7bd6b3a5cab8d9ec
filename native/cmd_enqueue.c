/* cmd_enqueue.c: EMQ.ENQUEUE's first form, the twin of enqueue.lua (2 keys): admit.lua's
 * admission and replay markers (admit.c), control.lua's dedup (D20, control.c). */
#include <string.h>

#include "emq.h"
#include "commands.gen.h"

/* The options past the fixed arguments (enqueue.lua's header): the named tail ('+opt' then
 * name, value pairs, args.lua opt_tail), or the positional form of 0.6 (ARGV[10..15]), parsed
 * once. An absent option has p == NULL, as emq_arg past the end. */
typedef struct {
    emq_sv dedup, dedup_mode, dedup_ttl_ms, second, priority, ttl_ms, keep_logs;
} enqueue_opts;

#define ENQUEUE_ARITY                                                                        \
    "ERR EMQ.ENQUEUE takes 2 keys (row, meta) and 6..24 args (enqueue) or 1 key (meta) and " \
    "9 + 2n args (enqueue_many)"

static void parse_opts(emq *e, enqueue_opts *o) {
    memset(o, 0, sizeof(*o));
    if (emq_eqs(emq_arg(e, 10), "+opt")) {
        if ((e->nargs - 10) % 2 != 0) emq_fail(e, ENQUEUE_ARITY);
        for (int i = 11; i < e->nargs; i += 2) {
            emq_sv name = emq_arg(e, i), *slot;
            if (emq_eqs(name, "dedup")) slot = &o->dedup;
            else if (emq_eqs(name, "dedup_mode")) slot = &o->dedup_mode;
            else if (emq_eqs(name, "dedup_ttl_ms")) slot = &o->dedup_ttl_ms;
            else if (emq_eqs(name, "second")) slot = &o->second;
            else if (emq_eqs(name, "priority")) slot = &o->priority;
            else if (emq_eqs(name, "ttl_ms")) slot = &o->ttl_ms;
            else if (emq_eqs(name, "keep_logs")) slot = &o->keep_logs;
            else emq_fail(e, "EMQARG unknown option in the tail (see PROTOCOL §6)");
            if (slot->p) emq_fail(e, "EMQARG an option named twice in the tail");
            *slot = emq_arg(e, i + 1);
        }
        return;
    }
    if (e->nargs > 15) emq_fail(e, ENQUEUE_ARITY);
    o->dedup = emq_arg(e, 10);
    o->dedup_mode = emq_arg(e, 11);
    o->dedup_ttl_ms = emq_arg(e, 12);
    o->second = emq_arg(e, 13);
    o->priority = emq_arg(e, 14);
    o->ttl_ms = emq_arg(e, 15);
}

/* enqueue.lua: KEYS row, meta; ARGV base id payload group mode value [flags replay_ms nonce
 * [option tail]]. */
void emq_cmd_enqueue(emq *e) {
    emq_sv id = emq_arg(e, 2), payload = emq_arg(e, 3), g = emq_arg(e, 4);
    emq_sv mode = emq_arg(e, 5), value = emq_arg(e, 6);
    if (emq_eqs(g, "")) g = EMQ_NONE;
    emq_sv flags = emq_arg(e, 7);
    enqueue_opts o;
    parse_opts(e, &o);
    emq_sv nonce = emq_arg(e, 9), did = o.dedup;
    if (!nonce.p) nonce = EMQ_LIT("");
    if (!did.p) did = EMQ_LIT("");
    /* The numbers the Lua would convert later are checked first: a malformed call is refused
     * before anything is written (the script would raise midway). */
    long long replay_ms = 0, dedup_ttl_ms = 0;
    if (emq_arg(e, 8).p) replay_ms = emq_need_ll(e, emq_arg(e, 8));
    if (did.n) dedup_ttl_ms = emq_need_ll(e, o.dedup_ttl_ms);
    if (emq_eqs(mode, "in") || emq_eqs(mode, "at")) (void)emq_need_ll(e, value);
    emq_sv pri = EMQ_LIT("0");
    if (o.priority.p) pri = emq_priority_arg(e, o.priority);
    emq_sv ttl = o.ttl_ms;
    long long ttl_ms = 0;
    if (ttl.p && ttl.n) ttl_ms = emq_need_ll(e, ttl);
    emq_sv keep = o.keep_logs.p ? emq_keep_logs_arg(e, o.keep_logs) : EMQ_NONE;
    int resend = emq_has_char(flags, 'r');
    emq_sv second = o.second;
    long long now = 0;
    if (!emq_eqs(mode, "now") || did.n || (ttl.p && ttl.n) || (nonce.n && !second.p))
        now = emq_now_ms(e);
    emq_sv expires = (ttl.p && ttl.n) ? emq_fmt_ll(e, now + ttl_ms) : EMQ_NONE;
    if (!emq_is_job(id)) {
        RedisModule_ReplyWithError(e->ctx, EMQ_KIND);
        return;
    }
    int fresh = emq_has_char(flags, 'f');
    /* The id is the marker (admit.lua): a resend of a minted id due now, without a nonce,
     * within EMQ_ID_REPLAY_MS landed before if its row holds this call's payload, or if the
     * id was retired since. A row with another payload is another call's (a collision):
     * the admission below answers "duplicate" and the client mints anew. */
    if (resend && fresh && !nonce.n && emq_eqs(mode, "now") && replay_ms > 0 &&
        replay_ms <= EMQ_ID_REPLAY_MS) {
        emq_sv jk = emq_key2(e, EMQ_KP_JOB, id);
        int landed = 0;
        if (emq_exists(e, jk) == 1) {
            /* Not a hash (planted): not this call's row either, as the Lua's TYPE check. */
            const char *fields[1] = {"payload"};
            emq_sv held[1];
            landed = emq_hmget(e, jk, 1, fields, held) && held[0].p && emq_eq(held[0], payload);
        } else {
            (void)emq_retired_last(e, id, &landed);
        }
        if (landed) {
            emq_reply_sv(e, EMQ_LIT("replayed"));
            return;
        }
    }
    emq_sv mk = EMQ_NONE, mf = EMQ_NONE;
    if (nonce.n && replay_ms > 0) {
        emq_sv at = second.p ? second : emq_fmt_ll(e, emq_floor_div(now, 1000));
        mk = emq_marker_key(e, nonce, emq_arg(e, 8), at);
        mf = emq_marker_field(e, id, nonce);
        if (resend) {
            const char *again = emq_find_one(e, mk, mf);
            if (again) {
                emq_reply_sv(e, emq_verdict_sv(again));
                return;
            }
        }
    }
    long long run_at = 0;
    int has_run_at = emq_run_time(e, mode, value, now, &run_at);
    if (did.n) {
        emq_sv lane = EMQ_NONE;
        emq_sv holder = emq_dedup_holder(e, did, o.dedup_mode, payload, has_run_at, run_at,
                                         now, g, pri, expires, keep, &lane);
        if (lane.p) {
            emq_sv text = emq_cat(e, 5, EMQ_LIT("EMQSTATE debounce holder "), holder,
                                  EMQ_LIT(" waits in "),
                                  lane.n ? emq_cat(e, 2, EMQ_LIT("lane "), lane)
                                         : EMQ_LIT("no lane"),
                                  EMQ_LIT(": a fold cannot move it to another lane"));
            char *msg = RedisModule_PoolAlloc(e->ctx, text.n + 1);
            memcpy(msg, text.p, text.n);
            msg[text.n] = '\0';
            RedisModule_ReplyWithError(e->ctx, msg);
            return;
        }
        if (holder.p) {
            emq_sv extra[4] = {EMQ_LIT("dedup"), did, EMQ_LIT("refused"), id};
            emq_emit(e, "deduplicated", holder, 4, extra);
            emq_reply_sv(e, emq_cat(e, 2, EMQ_LIT("deduplicated:"), holder));
            return;
        }
    }
    const char *verdict =
        emq_admit(e, id, payload, g, has_run_at, run_at, now, fresh, pri, expires, keep);
    int dup = strcmp(verdict, "duplicate") == 0;
    if (dup) emq_emit_in(e, "duplicate", id, g, 0, NULL);
    if (did.n && !dup) emq_take_dedup(e, id, did, dedup_ttl_ms);
    if (strcmp(verdict, "enqueued") == 0) emq_touch(e, g, 1);
    if (mk.p && !dup)
        emq_mark_one(e, mk, mf, verdict, replay_ms, !second.p || emq_has_char(flags, 'x'));
    emq_reply_sv(e, emq_verdict_sv(verdict));
}
