--[[ flow_deliver: one outbox entry of a cross-queue child, applied on its parent's queue
  (D18): the same fan-in a same-queue child's settle does. Idempotent (one record per child), so
  a pump that crashed before trimming the outbox, or two pumps at once, deliver it again
  harmlessly.
  KEYS[1] row       HASH  emq:{pq}:job:<parent id>
  ARGV[1] base            emq:{pq}:
  ARGV[2] kind            done | fail
  ARGV[3] parent id
  ARGV[4] child id
  ARGV[5] policy          fp | id | rm (fail only; rm: the child was removed, the parent
                          stops waiting for it and records nothing)
  ARGV[6] value           the child's result (done) or error (fail)
  ARGV[7] mark            optional: the child's flow mark ('' or absent: an entry written
                          before marks existed); a parent row with another mark is a new
                          flow under the re-used id and takes nothing
  Returns 1 (applied or already applied) | 0 (the parent row is gone: nothing to do)
  Flags: writes replay
]]
--@include common
--@include control
--@include compose
local base, kind, pid, cid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local mark = ARGV[7]
if mark == '' then mark = false end
if rcall('EXISTS', KEYS[1]) == 0 then return 0 end
if kind == 'done' then
  flow_settled(base, pid, 'processed', cid, ARGV[6], mark)
elseif ARGV[5] == 'rm' then
  flow_dropped(base, pid, cid, mark)
else
  flow_child_dead(base, cid, {pid, ARGV[5], false, '', mark}, ARGV[6])
end
trim_dead(base)  -- keep_dead: a fail_parent child kills its parent (include/history.lua)
return 1
