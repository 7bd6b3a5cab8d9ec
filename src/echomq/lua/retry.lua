--[[ retry: active -> schedule after delay_ms, or -> dead at the attempt ceiling. Fenced.
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] schedule  ZSET  emq:{q}:schedule
  KEYS[3] dead      ZSET  emq:{q}:dead
  KEYS[4] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] token
  ARGV[4] delay_ms        >= 0, on the server clock
  ARGV[5] max_attempts    the ceiling, compared with the row's cumulative attempts
  ARGV[6] error           kept as last_error
  ARGV[7] keep_ms         optional: > 0 keeps a dead-letter's error as its result (D17)
  Returns 'scheduled' | 'dead' | 'removed' (a cancel with remove, D22) | 0 when gone |
    error EMQSTALE
  Flags: writes once
  Native: EMQ.RETRY args=6..7
]]
--@include common
--@include args
--@include fence
--@include control
--@include compose
--@include settle
shape(4, 6, 7, 'ERR EMQ.RETRY takes 4 keys (active, schedule, dead, row) and 6..7 args (retry)')
local delay_ms, max_attempts = int_arg(ARGV[4]), int_arg(ARGV[5])
local keep_ms = ARGV[7] and int_arg(ARGV[7]) or 0
local now = now_ms()
local verdict = retry_one(ARGV[1], ARGV[2], KEYS[4], ARGV[3], delay_ms,
  max_attempts, ARGV[6], now, keep_ms)
trim_dead(ARGV[1], now)  -- keep_dead (include/history.lua)
if type(verdict) == 'string' and string.sub(verdict, 1, 3) == 'EMQ' then
  return redis.error_reply(verdict)
end
return verdict
