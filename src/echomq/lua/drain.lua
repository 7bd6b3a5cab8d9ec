--[[ drain: delete waiting jobs (the flat set and every lane; the schedule too when asked)
  with their rows and logs. Active jobs survive. Works in bounded slices: at most `budget`
  jobs and one SSCAN page of lanes per call; call again with the returned cursor until it
  answers ''. Each deleted row that was ever claimed has its last token recorded (common.lua
  retire), as complete and remove do.
  KEYS[1] pending   ZSET  emq:{q}:pending
  KEYS[2] lanes     SET   emq:{q}:lanes
  ARGV[1] base            emq:{q}:
  ARGV[2] include_schedule  '1' | '0'
  ARGV[3] budget          > 0, jobs deleted per call at most
  ARGV[4] cursor          '' to start; then what the previous call returned:
                          'f' (the flat set), 'l:<sscan cursor>' (lanes), 's' (the schedule)
  Returns {deleted, cursor}: cursor '' when the drain is done
  Flags: writes once
]]
--@include common
--@include control
--@include compose
local base = ARGV[1]
local budget = tonumber(ARGV[3])
local cursor = ARGV[4] or ''
if cursor == '' then cursor = 'f' end
local deleted = 0
local retired = {}
-- Empty up to the remaining budget from one waiting set; true when the set is empty.
local function empty_set(key)
  while budget > 0 do
    local popped = rcall('ZPOPMIN', key, math.min(budget, 500))
    if #popped == 0 then return true end
    for i = 1, #popped, 2 do
      local jk = base .. 'job:' .. popped[i]
      local att = redis.pcall('HGET', jk, 'attempts')
      if type(att) == 'string' and att ~= '0' then
        retired[#retired + 1] = popped[i]
        retired[#retired + 1] = att
      end
      release_dedup(base, popped[i], jk)
      -- A flow child's parent stops waiting for it (D18), as remove does.
      local flow = flow_parent(jk)
      if flow then
        flow_child_removed(base, popped[i], flow)
        flow_forget(jk)
      end
      rcall('DEL', jk, jk .. ':logs', jk .. ':errors')
    end
    deleted = deleted + #popped / 2
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
  -- One event per call (a slice), with how many jobs it deleted.
  if deleted > 0 then emit(base, 'drained', false, 'count', deleted) end
  return {deleted, next_cursor}
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
return finish('')
