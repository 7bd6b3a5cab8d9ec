--[[ complete: active (or pending after a reap, D5) -> done; token-fenced; deletes the row,
  or keeps it as `completed` in emq:{q}:completed while meta keep_completed asks (issue 24).
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] token           the attempts value claim returned
  ARGV[4] result          kept when keep_result_ms > 0 (D17), else dropped with the row
  ARGV[5] keep_result_ms  optional: > 0 writes emq:{q}:result:<id> with that TTL and wakes
                          the job's waiters (include/control.lua keep_outcome)
  Returns 1 | 0 when gone | error EMQSTALE
  Flags: writes once
  Native: EMQ.COMPLETE args=4..5
]]
--@include common
--@include args
--@include fence
--@include control
--@include compose
--@include settle
shape(2, 4, 5, 'ERR EMQ.COMPLETE takes 2 keys (active, row) and 4..5 args (complete)')
local keep_ms = ARGV[5] and int_arg(ARGV[5]) or 0
local base = ARGV[1]
local now = now_ms()
-- Kept history (include/history.lua): the row stays as `completed` while the queue asks.
local keep = kept_spec(base, 'keep_completed')
local verdict = complete_one(base, ARGV[2], KEYS[2], ARGV[3], ARGV[4], now, keep)
if type(verdict) == 'string' then return redis.error_reply(verdict) end
if verdict == 1 then
  bump_metrics(base, 'completed', 1, now)
  if keep_ms > 0 then keep_outcome(base, ARGV[2], 'result', ARGV[4], ARGV[3], keep_ms, now) end
  if keep then kept_trim(base, 'completed', keep, 1, now) end
end
return verdict
