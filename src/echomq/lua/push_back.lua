--[[ push_back: release the lease without spending an attempt, to schedule at now + delay_ms
  (pending at once for 0). Two callers: a handler's manual rate limit (D21, echomq.RateLimit)
  and a worker's shutdown hand-back (delay 0, PROTOCOL §3.9). The token still grows at the
  next claim (never reuse a token: a stale holder stays refused), so `floor` grows with it:
  retry's ceiling counts attempts - floor, and this run is not counted.
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] schedule  ZSET  emq:{q}:schedule
  KEYS[3] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] token
  ARGV[4] delay_ms        >= 0, on the server clock
  Returns 1 | 0 when gone | error EMQSTALE
  Flags: writes once
]]
--@include common
--@include fence
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[3]
local row, err = fence(jk, ARGV[3], 'delay')
if err then return redis.error_reply(err) end
if not row then return 0 end
release(base, id, jk, row)
rcall('HINCRBY', jk, 'floor', 1)
local ms = tonumber(ARGV[4])
if ms <= 0 then
  park(base, id, jk, row[3])
  touch(base, row[3], 1)
else
  rcall('HSET', jk, 'state', 'scheduled')
  rcall('ZADD', KEYS[2], now_ms() + ms, id)
end
-- As delay.lua reports a released lease, marked as a push back (no attempt spent).
emit_in(base, 'delayed', id, row[3], 'attempts', row[1], 'delay_ms', ms, 'pushed', '1')
return 1
