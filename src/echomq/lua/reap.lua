--[[ reap: active -> pending (or the lane) for every lapsed lease; the crash recovery sweep.
  Does not touch attempts: the next claim mints a new token, fencing the lapsed holder.
  KEYS[1] active    ZSET  emq:{q}:active
  ARGV[1] base            emq:{q}:
  ARGV[2] limit           > 0, jobs per call
  Returns the number recovered
  Flags: writes replay
]]
--@include common
local base = ARGV[1]
local lapsed = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[2]))
local added = tally()
local moved = 0
for _, id in ipairs(lapsed) do
  rcall('ZREM', KEYS[1], id)
  local jk = base .. 'job:' .. id
  local row = hmget(jk, 'state', 'group') or {}
  local g = row[2]
  if g then
    free_slot(base, g)
  end
  if row[1] then
    park(base, id, jk, g)
    emit_in(base, 'reaped', id, g)
    local key = g or FLAT
    tally_add(added, key, 1)
    moved = moved + 1
  end
end
touch_all(base, added)
return moved
