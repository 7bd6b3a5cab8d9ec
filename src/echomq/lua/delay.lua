--[[ delay: release a lease without minting: -> schedule at now + delay_ms, attempts untouched.
  delay_ms == 0 hands the job straight back to pending (its lane when grouped), so a worker
  shutting down returns unfinished work at once instead of waiting for a promote.
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
local ms = tonumber(ARGV[4])
if ms <= 0 then
  park(base, id, jk, row[3])
  touch(base, row[3], 1)
else
  rcall('HSET', jk, 'state', 'scheduled')
  rcall('ZADD', KEYS[2], now_ms() + ms, id)
end
emit_in(base, 'delayed', id, row[3], 'attempts', row[1], 'delay_ms', ms)
return 1
