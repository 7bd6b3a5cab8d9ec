--[[ drain: delete waiting jobs (the flat set and every lane; the schedule too when asked)
  with their rows and logs. Active jobs survive. Works in bounded slices: at most `budget`
  jobs and one SSCAN page of lanes per call; call again with the returned cursor until it
  answers ''. Each deleted row that was ever claimed has its last token recorded (common.lua
  retire), as complete and remove do.
  Issue 24, cancel_all: with ARGV[5] 'cancel' it is Queue.cancel_all's script: every job it
  deletes ends as cancel.lua ends a waiting one (a `cancelled` event each instead of one
  `drained` a slice; a result waiter already waiting gets the outcome "cancelled" for 60 s),
  and once the waiting sets (and the schedule: the client asks for it) are empty it signals
  the active jobs, at most `budget` a call, as cancel.lua signals one (field `cancel`,
  meta.cancels, a `cancelled` event with signalled=1); a flag already set is kept.
  KEYS[1] pending   ZSET  emq:{q}:pending
  KEYS[2] lanes     SET   emq:{q}:lanes
  ARGV[1] base            emq:{q}:
  ARGV[2] include_schedule  '1' | '0'
  ARGV[3] budget          > 0, jobs deleted per call at most
  ARGV[4] cursor          '' to start; then what the previous call returned:
                          'f' (the flat set), 'l:<sscan cursor>' (lanes), 's' (the schedule),
                          'a:<rank>' (active, cancel mode only)
  ARGV[5] mode            optional: 'cancel' (cancel_all, above); absent or '': drain
  Returns {deleted, cursor, signalled}: cursor '' when the drain is done
  Flags: writes once
]]
--@include common
--@include control
--@include compose
local base = ARGV[1]
local budget = tonumber(ARGV[3])
local cursor = ARGV[4] or ''
if cursor == '' then cursor = 'f' end
local deleted, signalled = 0, 0
local retired = {}
local CANCEL = ARGV[5] == 'cancel'
local now = CANCEL and now_ms()

-- cancel_all: a deleted job ends as cancel.lua ends a waiting one (its event, its waiter).
local function cancelled_one(id, g, att)
  if type(g) ~= 'string' then g = false end
  emit_in(base, 'cancelled', id, g)
  if rcall('EXISTS', base .. 'want:' .. id) == 1 then
    keep_outcome(base, id, 'error', 'cancelled', type(att) == 'string' and att or '0', 60000, now)
  end
end
-- Delete one waiting job (already out of its set) with its row, logs and side keys.
local function drain_one(id)
  local jk = base .. 'job:' .. id
  local att = redis.pcall('HGET', jk, 'attempts')
  if type(att) == 'string' then
    retired[#retired + 1] = id
    retired[#retired + 1] = att
  end
  local g = CANCEL and redis.pcall('HGET', jk, 'group')
  release_dedup(base, id, jk)
  -- A flow child's parent stops waiting for it (D18), as remove does.
  local flow = flow_parent(jk)
  if flow then
    flow_child_removed(base, id, flow)
    flow_forget(jk)
  end
  rcall('DEL', jk, jk .. ':logs', jk .. ':errors')
  deleted = deleted + 1
  if CANCEL then cancelled_one(id, g, att) end
  -- Dropping the child may have released its parent (same queue) into a waiting set: the
  -- parent is then a waiting job of this queue too, and goes with this drain whichever set
  -- it landed in (a set already walked would otherwise keep it: F11 of issue 22's model).
  if flow and flow[1] and not (flow[4] and flow[4] ~= '') then
    local pk = base .. 'job:' .. flow[1]
    local p = hmget(pk, 'state', 'group')
    if p and p[1] == 'pending' and rcall('ZREM', waiting_key(base, p[2]), flow[1]) == 1 then
      sync(base, p[2] or false)
      drain_one(flow[1])
    end
  end
end

-- Empty up to the remaining budget from one waiting set; true when the set is empty.
local function empty_set(key)
  while budget > 0 do
    local popped = rcall('ZPOPMIN', key, math.min(budget, 500))
    if #popped == 0 then return true end
    for i = 1, #popped, 2 do drain_one(popped[i]) end
    budget = budget - #popped / 2
  end
  return rcall('ZCARD', key) == 0
end

local function finish(next_cursor)
  -- retire only keeps integer counts: a planted non-integer attempts is not carried over.
  local clean = {}
  for i = 1, #retired, 2 do
    if string.match(retired[i + 1], '^[0-9]+$') then
      clean[#clean + 1] = retired[i]
      clean[#clean + 1] = retired[i + 1]
    end
  end
  retire(base, clean)
  -- One event per call (a slice), with how many jobs it deleted (cancel: one a job, above).
  if deleted > 0 and not CANCEL then emit(base, 'drained', false, 'count', deleted) end
  return {deleted, next_cursor, signalled}
end

-- cancel_all: signal up to `budget` active jobs from rank `rank` on, as cancel.lua does.
local function signal_active(rank)
  local page = rcall('ZRANGE', base .. 'active', rank, rank + budget - 1)
  for _, id in ipairs(page) do
    local jk = base .. 'job:' .. id
    local row = hmget(jk, 'state', 'group')
    if row and row[1] == 'active' and rcall('HSETNX', jk, 'cancel', '1') == 1 then
      rcall('HINCRBY', base .. 'meta', 'cancels', 1)
      emit_in(base, 'cancelled', id, row[2], 'signalled', '1')
      signalled = signalled + 1
    end
  end
  if #page < budget then return finish('') end
  return finish('a:' .. (rank + #page))
end

if cursor == 'f' then
  local done = empty_set(KEYS[1])
  sync(base, false)
  if not done then return finish('f') end
  cursor = 'l:0'
end
if string.sub(cursor, 1, 2) == 'l:' then
  local page = rcall('SSCAN', KEYS[2], string.sub(cursor, 3), 'COUNT', 100)
  for _, g in ipairs(page[2]) do
    local done = empty_set(waiting_key(base, g))
    sync(base, g)
    -- Out of budget inside this page: the same page again next call (SSCAN allows repeating
    -- a cursor; the lanes emptied meanwhile have left the registry).
    if not done then return finish(cursor) end
  end
  if page[1] ~= '0' then return finish('l:' .. page[1]) end
  cursor = 's'
end
if cursor == 's' and ARGV[2] == '1' then
  if not empty_set(base .. 'schedule') then return finish('s') end
end
if CANCEL then
  if cursor == 's' then cursor = 'a:0' end
  return signal_active(tonumber(string.sub(cursor, 3)) or 0)
end
return finish('')
