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
local added = tally()
local moved = 0
for _, id in ipairs(due) do
  rcall('ZREM', KEYS[1], id)
  local jk = base .. 'job:' .. id
  local row = hmget(jk, 'state', 'group') or {}
  -- A ghost (no row) is dropped from the set and never resurrected.
  if row[1] then
    park(base, id, jk, row[2])
    emit_in(base, 'promoted', id, row[2])
    local key = row[2] or FLAT
    tally_add(added, key, 1)
    moved = moved + 1
  end
end
touch_all(base, added)
-- Self-heal, once a beat: enqueue's fast path (touch) trusts that a non-empty flat set is in
-- the ring. Should the ring lose it anyway (a member planted from outside, a lost key), the
-- flat set would never be served again; the next promote puts it back. The LIST is walked
-- (LPOS) only when the ring and its SETs disagree in size, i.e. only after such damage.
local depth = rcall('ZCARD', base .. 'pending')
if depth > 0 then
  local ring = base .. 'ring'
  local live = rcall('SISMEMBER', base .. 'inring', FLAT) == 1
  local sized = rcall('LLEN', ring) == rcall('SCARD', base .. 'inring') + rcall('SCARD', base .. 'ringstale')
  if not sized and not rcall('LPOS', ring, FLAT) then
    rcall('SREM', base .. 'inring', FLAT)
    rcall('SREM', base .. 'ringstale', FLAT)
    ring_add(base, FLAT)
    wake(base, depth)
  elseif not live then
    ring_add(base, FLAT)
    wake(base, depth)
  end
end
return moved
