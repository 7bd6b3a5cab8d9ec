--[[ reap: active -> pending (or the lane) for every lapsed lease; the crash recovery sweep.
  Does not touch attempts: the next claim mints a new token, fencing the lapsed holder.
  A job whose holder was asked to stop (D22 cancel flag) is not run again: it is dead-
  lettered "cancelled" (or removed, cancel(remove=True)) and not counted as recovered.
  KEYS[1] active    ZSET  emq:{q}:active
  ARGV[1] base            emq:{q}:
  ARGV[2] limit           > 0, jobs per call
  Returns the number recovered
  Flags: writes replay
]]
--@include common
--@include control
--@include compose
local base = ARGV[1]
local now = now_ms()
local lapsed = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local added = tally()
local moved = 0
for _, id in ipairs(lapsed) do
  rcall('ZREM', KEYS[1], id)
  local jk = base .. 'job:' .. id
  local row = hmget(jk, 'state', 'group', 'attempts', 'cancel') or {}
  local g = row[2]
  if g then
    free_slot(base, g)
    tally_add(added, g, 0)
  end
  if row[1] and row[4] then
    -- D22: its holder was asked to stop; the job does not run again (compose.lua).
    end_cancelled(base, id, jk, g, row[4], row[3], now)
  elseif row[1] then
    park(base, id, jk, g)
    emit_in(base, 'reaped', id, g)
    local key = g or FLAT
    tally_add(added, key, 1)
    moved = moved + 1
  end
end
touch_all(base, added)
trim_dead(base, now)  -- keep_dead: a cancelled lapse dead-letters (include/history.lua)
return moved
