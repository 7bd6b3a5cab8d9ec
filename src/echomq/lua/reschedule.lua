--[[ reschedule: a scheduled job's run time changed (issue 24; BullMQ's changeDelay). Only a
  scheduled job: a waiting job is refused, so the schedule is never where a job that may be
  claimed right now goes (use delay from its handler, or enqueue it with a delay). A run time
  that is already due leaves the job in the schedule, due: the next promote moves it
  (run_now moves it at once). The job keeps its expiry (`expires` counts from its enqueue).
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] schedule  ZSET  emq:{q}:schedule
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] mode            in (server clock + ms) | at (the caller's absolute ms, D10)
  ARGV[4] value           ms
  Returns 1 | 0 when gone | error EMQSTATE not scheduled (nothing written)
  Flags: writes replay
]]
--@include common
--@include args
shape(2, 4, 4, 'ERR reschedule takes 2 keys (row, schedule) and 4 args (base, id, mode, value)')
local value = int_arg(ARGV[4])
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[1]
if rcall('EXISTS', jk) == 0 then return 0 end
local row = hmget(jk, 'group')
if not row then return redis.error_reply('EMQSTATE not a job row') end
if not rcall('ZSCORE', KEYS[2], id) then return redis.error_reply('EMQSTATE not scheduled') end
local run_at = value
if ARGV[3] == 'in' then run_at = now_ms() + value end
rcall('ZADD', KEYS[2], 'XX', run_at, id)
emit_in(base, 'rescheduled', id, row[1], 'run_at', run_at)
return 1
