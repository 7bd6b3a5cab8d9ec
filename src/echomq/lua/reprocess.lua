--[[ reprocess: dead or a kept completed row (issue 24) -> pending (a grouped job back to its
  lane, D6), or -> schedule with a run time. attempts is kept (it is the token: a lower one
  would be handed out again); the stall count restarts, so a job that died stalled gets
  max_stalled fresh stalls, not one; and `floor` becomes attempts, so the retry ceiling
  (attempts - floor >= max_attempts) gives it a fresh budget. It starts a new incarnation:
  the previous one's kept result, wake token, cancel flag, progress, run times and
  first-claim deadline (`expires`, issue 24) go.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] dead      ZSET  emq:{q}:dead
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] mode            optional: in (server clock + ms) | at (the caller's absolute ms)
  ARGV[4] ms              with mode: a run time past now sends the job to schedule
  Returns 1 | 0 when gone | error EMQSTATE not dead or completed
  Flags: writes once
  Native: EMQ.REPROCESS args=2|4
]]
--@include common
--@include args
local ARITY = 'ERR EMQ.REPROCESS takes 2 keys (row, dead) and 2 or 4 args (reprocess)'
shape(2, 2, 4, ARITY)
if #ARGV == 3 then refuse(ARITY) end
local base, id, mode = ARGV[1], ARGV[2], ARGV[3]
local ms = nil
if mode then
  if mode ~= 'in' and mode ~= 'at' then refuse('ERR EMQ.REPROCESS mode must be in or at') end
  ms = int_arg(ARGV[4])
end
local jk = KEYS[1]
if rcall('EXISTS', jk) == 0 then return 0 end
local row = hmget(jk, 'group', 'attempts')
if not row then return redis.error_reply('EMQSTATE not a job row') end
if rcall('ZREM', KEYS[2], id) == 0 and rcall('ZREM', base .. 'completed', id) == 0 then
  return redis.error_reply('EMQSTATE not dead or completed')
end
local g = row[1]
rcall('HDEL', jk, 'last_error', 'stalled', 'cancel', 'progress', 'finished_ms', 'claimed_ms',
  'expires')
-- A new incarnation: the previous one's kept outcome and wake token must not answer its
-- waiters before this one runs (docs/PROTOCOL.md, the side-key lifecycle).
rcall('DEL', base .. 'result:' .. id, base .. 'notify:' .. id)
if row[2] and row[2] ~= '0' and string.match(row[2], '^[0-9]+$') then
  rcall('HSET', jk, 'floor', row[2])
end
local run_at = nil
if mode then
  local now = now_ms()
  run_at = mode == 'in' and now + ms or ms
  if run_at <= now then run_at = nil end
end
if run_at then
  rcall('HSET', jk, 'state', 'scheduled')
  rcall('ZADD', base .. 'schedule', run_at, id)
  emit_in(base, 'reprocessed', id, g, 'run_at', run_at)
  return 1
end
park(base, id, jk, g)
touch(base, g, 1)
emit_in(base, 'reprocessed', id, g)
return 1
