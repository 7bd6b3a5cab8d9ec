--[[ rate_ttl: the ms until a spent rate window reopens (D21); 0 when claims are allowed.
  KEYS[1] meta      HASH  emq:{q}:meta
  ARGV[1] base            emq:{q}:
  ARGV[2] lane            '' for the queue-wide window; '*' for the worker's idle wait
  Returns ms; for '*': {queue-wide ms, ms until the first rate-held lane is readmitted}
  Flags: reads replay
]]
--@include common
local base, g = ARGV[1], ARGV[2]
-- A spent window answers at least 1 ms while its counter exists: PTTL says 0 in the last
-- millisecond before the key expires, and a claim in that millisecond still finds it spent.
local function spent(key, max)
  if not max or rate_left(key, max) > 0 then return 0 end
  local ttl = rcall('PTTL', key)
  if ttl == -1 then return 0 end  -- a counter without a TTL (not ours): nothing to wait for
  return math.max(ttl, 1)
end
if g == '' or g == '*' then
  local wait = spent(base .. 'limiter', queue_rate(base))
  if g == '' then return wait end
  local first = rcall('ZRANGE', base .. 'ratewait', 0, 0, 'WITHSCORES')
  if #first == 0 then return {wait, 0} end
  return {wait, math.max(tonumber(first[2]) - now_ms(), 1)}
end
-- A spent lane comes back when a claim at or after its ratewait time readmits it: never
-- answer 0 before then (its limiter key may expire a millisecond earlier).
local wait = spent(base .. 'limiter:' .. g, lane_rate(base, g))
local at = rcall('ZSCORE', base .. 'ratewait', g)
if at then wait = math.max(wait, tonumber(at) - now_ms()) end
return wait
