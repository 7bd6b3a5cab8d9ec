--[[ extend_many: extend many held leases on one clock read; each pair fenced on its own.
  KEYS[1] active    ZSET  emq:{q}:active
  ARGV[1] base            emq:{q}:
  ARGV[2] lease_ms        > 0
  ARGV[3..] id, token, id, token, ...
  Returns {id, ...}: the ids whose extend failed (gone, stale or settled), then '!' .. id for
    each extended job whose cancel flag is set (D22; '!' is never part of an id)
  A heartbeat is never refused for memory (allow-oom, protocol/scripts.py): it only moves scores.
  Flags: writes replay allow-oom
  Native: EMQ.EXTEND args=2..
]]
--@include common
--@include args
--@include fence
--@include control
shape(1, 2, nil, 'ERR EMQ.EXTEND takes 2 keys (active, row) and 4 args (extend) or 1 key (active) and at least 2 args (extend_many)')
local lease_ms = int_arg(ARGV[2])
local base = ARGV[1]
local deadline = now_ms() + lease_ms
local failed, flagged = {}, {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local jk = base .. 'job:' .. id
  local row = fence(jk, ARGV[i + 1], 'extend')
  if row then
    rearm(base, id, jk, row, deadline)
    if cancel_flagged(jk) then flagged[#flagged + 1] = '!' .. id end
  else
    failed[#failed + 1] = id
  end
end
for _, f in ipairs(flagged) do failed[#failed + 1] = f end
return failed
