--[[ cancel: cooperative cancel (D22). A waiting or scheduled job is removed at once (exactly
  as remove does it: lanes, the ring and the retired record stay exact, its dedup key is
  released); an active job gets the row field `cancel`, which its holder's next heartbeat
  (extend_many) reports, and the holder dead-letters it with last_error "cancelled"; the
  meta field `cancels` counts these, so a holder that polls it extends at once. Both
  emit the D15 event `cancelled` (with `signalled=1` for an active job).
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] remove          optional: '1' has the holder remove an active job, not dead-letter it
  ARGV[4] seen            optional (issue 37): the state the caller saw ('active', or
                          'active:<attempts>'); a job that has moved since (retried to the
                          schedule, say) is skipped, nothing written. Needs ARGV[3] ('0': no)
  Returns 'removed' | 'signalled' | 'absent' (no row, or nothing runs or waits: dead) |
    error EMQLOCK | error EMQSTATE moved (seen given, the job is elsewhere now)
  Flags: writes once
]]
--@include common
--@include control
--@include compose
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[1]
local row = hmget(jk, 'state', 'group', 'attempts')
if not row or not row[1] then return 'absent' end
local state, g = row[1], row[2]
if moved_since(row, ARGV[4]) then
  return redis.error_reply('EMQSTATE moved: now ' .. state .. ', attempts ' .. tostring(row[3]))
end
if state == 'active' and rcall('ZSCORE', base .. 'active', id) then
  -- The holder's settle reads the flag's value (include/settle.lua retry_one).
  rcall('HSET', jk, 'cancel', ARGV[3] == '1' and 'remove' or '1')
  rcall('HINCRBY', base .. 'meta', 'cancels', 1) -- the nudge holders' heartbeats poll
  emit_in(base, 'cancelled', id, g, 'signalled', '1')
  return 'signalled'
end
if state ~= 'pending' and state ~= 'scheduled' then return 'absent' end
if rcall('EXISTS', jk .. ':lock') == 1 then return redis.error_reply('EMQLOCK job is locked') end
leave_waiting(base, id, g)
if g then leave_waiting(base, id, false) end
rcall('ZREM', base .. 'schedule', id)
release_dedup(base, id, jk)
-- As remove does: a flow child's parent stops waiting for it; a parent's keys go with it.
local flow = flow_parent(jk)
if flow then flow_child_removed(base, id, flow) end
flow_forget(jk)
rcall('DEL', jk, jk .. ':logs', jk .. ':errors')
local now = now_ms()
retire_one(base, id, row[3])
emit_in(base, 'cancelled', id, g)
-- D17: a result waiter already waiting (its marker is set) learns the job will never finish:
-- the outcome "cancelled" is kept for 60 s and wakes it (the row holds no keep time).
if rcall('EXISTS', base .. 'want:' .. id) == 1 then
  keep_outcome(base, id, 'error', 'cancelled', row[3], 60000, now)
end
return 'removed'
