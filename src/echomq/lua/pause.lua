--[[ pause: stop every claim of the queue (flat and lanes, single and batch). Idempotent.
  KEYS[1] meta      HASH  emq:{q}:meta
  Returns 1
  Flags: writes replay
]]
redis.call('HSET', KEYS[1], 'paused', '1')
return 1
