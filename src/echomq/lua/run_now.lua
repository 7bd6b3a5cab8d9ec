--[[ run_now: one scheduled job -> waiting now (a grouped job to its lane), whatever its run
  time: the operator's "run now" (dashboard, CLI). The row's state is rewritten and the job
  leaves the schedule in the same call, so a concurrent promote or run_now of any job can
  neither lose it nor move another one.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] schedule  ZSET  emq:{q}:schedule
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  Returns 1 | 0 when gone | error EMQSTATE not scheduled (nothing written)
  Flags: writes once
]]
--@include common
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[1]
if rcall('EXISTS', jk) == 0 then return 0 end
local row = hmget(jk, 'group')
if not row then return redis.error_reply('EMQSTATE not a job row') end
if rcall('ZREM', KEYS[2], id) == 0 then return redis.error_reply('EMQSTATE not scheduled') end
local g = row[1]
park(base, id, jk, g)
touch(base, g, 1)
emit_in(base, 'promoted', id, g)
return 1
