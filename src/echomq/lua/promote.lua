--[[ promote: schedule -> pending (or the job's lane) for every job now due (server clock).
  KEYS[1] schedule  ZSET  emq:{q}:schedule
  ARGV[1] base            emq:{q}:
  ARGV[2] limit           > 0, jobs per call
  Returns the number promoted
  Flags: writes replay
]]
--@include common
local base = ARGV[1]
local due = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[2]))
local added = {}
local moved = 0
for _, id in ipairs(due) do
  rcall('ZREM', KEYS[1], id)
  local jk = base .. 'job:' .. id
  local row = hmget(jk, 'state', 'group') or {}
  -- A ghost (no row) is dropped from the set and never resurrected.
  if row[1] then
    park(base, id, jk, row[2])
    local key = row[2] or FLAT
    added[key] = (added[key] or 0) + 1
    moved = moved + 1
  end
end
touch_all(base, added)
-- Self-heal, once a beat: enqueue's fast path (touch) trusts that a non-empty flat set is in
-- the ring. Should the ring lose it anyway (a member planted from outside, a lost key), the
-- flat set would never be served again; the next promote puts it back.
local depth = rcall('ZCARD', base .. 'pending')
if depth > 0 and not rcall('LPOS', base .. 'ring', FLAT) then
  rcall('RPUSH', base .. 'ring', FLAT)
  wake(base, depth)
end
return moved
