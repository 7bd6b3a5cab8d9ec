--[[ rate_limit: set or clear a rate limit (D21, include/ratelimit.lua): queue-wide, or one
  lane's. A lane's ring membership is recomputed at once (a cleared or raised limit can make
  it serviceable again); parked workers are woken when claims may have become possible.
  KEYS[1] meta      HASH  emq:{q}:meta
  ARGV[1] base            emq:{q}:
  ARGV[2] lane            '' for the queue-wide limit
  ARGV[3] max             > 0, or '' to clear the limit (and its window's count)
  ARGV[4] window_ms       > 0 (ignored when clearing)
  Returns 1
  Flags: writes replay
]]
--@include common
local base, g, max = ARGV[1], ARGV[2], ARGV[3]
if g == '' then
  if max == '' then
    rcall('HDEL', KEYS[1], 'rate_max', 'rate_window_ms')
    rcall('DEL', base .. 'limiter')
  else
    rcall('HSET', KEYS[1], 'rate_max', max, 'rate_window_ms', ARGV[4])
  end
  wake(base, 64)
  return 1
end
if max == '' then
  rcall('HDEL', base .. 'grate', g)
  rcall('DEL', base .. 'limiter:' .. g)
else
  rcall('HSET', base .. 'grate', g, max .. ':' .. ARGV[4])
end
-- meta `grated` says some lane has a limit: the claims skip every lane-rate read without it.
if rcall('EXISTS', base .. 'grate') == 1 then
  rcall('HSET', KEYS[1], 'grated', '1')
else
  rcall('HDEL', KEYS[1], 'grated')
end
rcall('ZREM', base .. 'ratewait', g)
touch(base, g, 0)
return 1
