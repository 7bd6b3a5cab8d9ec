--[[ remove: delete a job wherever it is (waiting, lane, active, schedule, dead, a kept
  completed row in completed) with its logs;
  lanes, the ring and gactive stay consistent (D6).
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  The id's last token is recorded (common.lua retire): a re-admission continues from it.
  Returns 1 | 0 when gone (a ghost id is still taken out of the flat/active/schedule/dead
    sets, and completed) | error EMQLOCK
  Flags: writes once
]]
--@include common
--@include control
--@include compose
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[1]
local row = hmget(jk, 'state', 'group', 'attempts') or {}
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
if rcall('EXISTS', jk .. ':lock') == 1 then return redis.error_reply('EMQLOCK job is locked') end
local g = row[2]
leave_active(base, id, g)
leave_waiting(base, id, g)
if g then leave_waiting(base, id, false) end
rcall('ZREM', base .. 'schedule', id)
rcall('ZREM', base .. 'dead', id)
rcall('ZREM', base .. 'completed', id)
release_dedup(base, id, jk)
-- A flow child's parent stops waiting for it (D18); a parent's own keys go with it.
local flow = flow_parent(jk)
if flow then flow_child_removed(base, id, flow) end
flow_forget(jk)
rcall('DEL', jk, jk .. ':logs', jk .. ':errors')
retire_one(base, id, row[3])
emit_in(base, 'removed', id, g, 'state', row[1] or '')
return 1
