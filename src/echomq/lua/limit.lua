--[[ limit: the queue-wide concurrency limit: at most n jobs of the queue in active at once,
  lanes included, across every worker ('' removes it). Kept in meta `limit`; every claim path
  reads it with the pause flag (common.lua claim_gate) and takes no more than the room left
  (n - ZCARD active; include/lease.lua claim_n).
  KEYS[1] meta      HASH  emq:{q}:meta
  ARGV[1] base            emq:{q}:
  ARGV[2] n               > 0, or '' for no limit
  Returns 1
  Flags: writes replay
]]
--@include common
--@include args
shape(1, 2, 2, 'ERR limit takes 1 key and 2 args')
if ARGV[2] == '' then
  if rcall('HDEL', KEYS[1], 'limit') == 0 then return 1 end
else
  local n = int_arg(ARGV[2])
  if n < 1 then refuse('ERR limit must be a positive integer') end
  if rcall('HGET', KEYS[1], 'limit') == ARGV[2] then return 1 end
  rcall('HSET', KEYS[1], 'limit', n)
end
-- Room may have opened: wake the idle workers (as resume does), one per ring entry and more.
wake(ARGV[1], rcall('LLEN', ARGV[1] .. 'ring') * 8)
return 1
