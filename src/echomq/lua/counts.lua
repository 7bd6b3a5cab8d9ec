--[[ counts: one consistent snapshot of the queue's sizes and metrics.
  KEYS[1] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  Returns {pending (flat + every lane), active, schedule, dead, completed, failed, kept}:
    completed and failed are the all-time counters, kept the kept completed rows (issue 24)
  Flags: reads replay
]]
local rcall = redis.call
local base = ARGV[1]
local pending = rcall('ZCARD', base .. 'pending')
for _, g in ipairs(rcall('SMEMBERS', base .. 'lanes')) do
  pending = pending + rcall('ZCARD', base .. 'g:' .. g .. ':pending')
end
return {
  pending,
  rcall('ZCARD', base .. 'active'),
  rcall('ZCARD', base .. 'schedule'),
  rcall('ZCARD', base .. 'dead'),
  tonumber(rcall('HGET', base .. 'metrics:completed', 'count') or '0'),
  tonumber(rcall('HGET', base .. 'metrics:failed', 'count') or '0'),
  rcall('ZCARD', base .. 'completed'),
}
