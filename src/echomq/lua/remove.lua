--[[ remove: delete a job wherever it is (waiting, lane, active, schedule, dead, a kept
  completed row in completed) with its logs;
  lanes, the ring and gactive stay consistent (D6).
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] children        optional (issue 24): '1' removes a flow parent's waiting descendants
                          on this queue with it (pending, scheduled or awaiting their own
                          children, found through the row field `kids`, down the tree); the
                          active ones run on (their settle records nothing: the parent is
                          gone) and the dead ones stay. Absent or '0': the parent alone.
  ARGV[4] seen            optional (issue 37): the state the caller saw ('dead', or
                          'dead:<attempts>' with the row's attempts then); a job that has
                          moved since is skipped, nothing written. Needs ARGV[3]
  The id's last token is recorded (common.lua retire): a re-admission continues from it.
  Returns 1 | 0 when gone (a ghost id is still taken out of the flat/active/schedule/dead
    sets, and completed) | error EMQLOCK | error EMQSTATE moved (seen given, the job is
    elsewhere or on another attempt now)
  Flags: writes once
]]
--@include common
--@include control
--@include compose
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[1]
local row = hmget(jk, 'state', 'group', 'attempts', 'kids') or {}
if rcall('EXISTS', jk) == 0 then
  -- Gone, but a ghost (the id in a set, its row lost) is still taken out of the sets that can
  -- be found without the row; a lane ghost is discarded by the next claim of its lane.
  rcall('ZREM', base .. 'active', id)
  leave_waiting(base, id, false)
  rcall('ZREM', base .. 'schedule', id)
  rcall('ZREM', base .. 'dead', id)
  rcall('ZREM', base .. 'completed', id)
  return 0
end
if moved_since(row, ARGV[4]) then
  return redis.error_reply('EMQSTATE moved: now ' .. tostring(row[1]) .. ', attempts '
    .. tostring(row[3]))
end
if rcall('EXISTS', jk .. ':lock') == 1 then return redis.error_reply('EMQLOCK job is locked') end

-- Delete one job (row read as above) from wherever it is, with its side keys.
local function remove_one(rid, rk, r)
  local g = r[2]
  leave_active(base, rid, g)
  leave_waiting(base, rid, g)
  if g then leave_waiting(base, rid, false) end
  rcall('ZREM', base .. 'schedule', rid)
  rcall('ZREM', base .. 'dead', rid)
  rcall('ZREM', base .. 'completed', rid)
  release_dedup(base, rid, rk)
  -- A flow child's parent stops waiting for it (D18); a parent's own keys go with it.
  local flow = flow_parent(rk)
  if flow then flow_child_removed(base, rid, flow) end
  flow_forget(rk)
  rcall('DEL', rk, rk .. ':logs', rk .. ':errors')
  retire_one(base, rid, r[3])
  emit_in(base, 'removed', rid, g, 'state', r[1] or '')
end

remove_one(id, jk, row)
-- Issue 24: the waiting descendants, breadth first (a tree is at most 8 deep, D18). A kid
-- whose row names another parent (its id was re-admitted since) is not this tree's.
local WAITING = {pending = true, scheduled = true, awaiting_children = true}
local todo = {{id, row[4]}}
local i = 1
while ARGV[3] == '1' and todo[i] do
  local pid, kids = todo[i][1], todo[i][2] or ''
  for at = 1, #kids - 13, 14 do
    local kid = string.sub(kids, at, at + 13)
    local kk = base .. 'job:' .. kid
    local kr = hmget(kk, 'state', 'group', 'attempts', 'kids', 'parent')
    if kr and WAITING[kr[1] or ''] and kr[5] == pid then
      remove_one(kid, kk, kr)
      todo[#todo + 1] = {kid, kr[4]}
    end
  end
  i = i + 1
end
return 1
