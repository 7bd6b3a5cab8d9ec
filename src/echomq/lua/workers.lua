--[[ workers: the live entries of a queue's worker registry (those whose beat has not lapsed).
  KEYS[1] workers      HASH  emq:{q}:workers
  KEYS[2] workers:ttl  ZSET  emq:{q}:workers:ttl
  Returns {now, {id, entry, lapse_ms, ...}}: the server ms, then per live worker its id, its
  JSON entry and the server ms its entry lapses at
  Flags: reads replay
]]
--@include common
local now = now_ms()
local live = rcall('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local entry = rcall('HGET', KEYS[1], live[i])
  if entry then
    out[#out + 1] = live[i]
    out[#out + 1] = entry
    out[#out + 1] = live[i + 1]
  end
end
return {now, out}
