--[[ propose_shards: store a sharded queue's layout when it extends the one stored (issue 43).
  The layout is the comma-joined list of the logical queue's sub-queue names, shard 0 (the
  queue itself) first, kept in meta `shards`; absent means one shard. A proposal is stored
  only when it extends the stored list (the stored names, in order, then more) or, with
  nothing stored, has more than one name; anything else leaves the stored list as it is, so
  a layout only grows and every client ends up with the same list (the one it answers).
  KEYS[1] meta      HASH  emq:{q}:meta
  ARGV[1] base            emq:{q}:
  ARGV[2] proposal        q,<shard 1>,...: names of [A-Za-z0-9._-]{1,128}, the first q, at most 256
  Returns the stored list after the call (q alone when nothing is stored)
    | error EMQSTATE limited <q>: nothing is stored, the proposal shards the queue and it has
    a queue-wide limit or rate limit (meta `limit`, `rate_max`): a sharded queue has none,
    and the one stored would bind shard 0 alone; nothing written
  Flags: writes replay
]]
--@include args
shape(1, 2, 2, 'ERR propose_shards takes 1 key and 2 args')
local base = ARGV[1]
local name = string.sub(base, string.find(base, '{', 1, true) + 1, string.find(base, '}', 1, true) - 1)
local proposal = ARGV[2]
local names = {}
local seen = {}
for part in string.gmatch(proposal .. ',', '([^,]*),') do
  if #part < 1 or #part > 128 or not string.match(part, '^[A-Za-z0-9._-]+$') or seen[part] then
    refuse('ERR propose_shards: a layout is distinct queue names of [A-Za-z0-9._-]{1,128}')
  end
  seen[part] = true
  names[#names + 1] = part
end
if names[1] ~= name or #names > 256 then
  refuse('ERR propose_shards: a layout starts with the queue itself and has at most 256 shards')
end
local stored = redis.call('HGET', KEYS[1], 'shards')
if stored then
  if #names > 1 and string.sub(proposal, 1, #stored + 1) == stored .. ',' then
    redis.call('HSET', KEYS[1], 'shards', proposal)
    return proposal
  end
  return stored
end
if #names > 1 then
  local held = redis.call('HMGET', KEYS[1], 'limit', 'rate_max')
  if held[1] or held[2] then return redis.error_reply('EMQSTATE limited ' .. name) end
  redis.call('HSET', KEYS[1], 'shards', proposal)
  return proposal
end
return name
