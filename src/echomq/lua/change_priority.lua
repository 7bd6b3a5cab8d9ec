--[[ change_priority: a waiting or scheduled job's priority (0..2^21, lower runs first).
  A waiting job is rescored in its waiting set (its flat set or lane) in the same call, so its
  next claim follows the new priority; a scheduled job gets only the row field, which its
  promotion reads (common.lua park). The field is written only for a non-zero priority: 0
  deletes it, so a default job holds no byte for it.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] priority        0..2097152
  Returns 1 | 0 when gone | error EMQSTATE not waiting or scheduled (<state>) (nothing
    written: an active job is held, a dead one is out of the queue, a flow parent awaits)
  Flags: writes replay
]]
--@include common
--@include args
shape(1, 3, 3, 'ERR change_priority takes 1 key and 3 args')
local base, id = ARGV[1], ARGV[2]
local pri = priority_arg(ARGV[3])
local jk = KEYS[1]
if rcall('EXISTS', jk) == 0 then return 0 end
local row = hmget(jk, 'state', 'group')
if not row then return redis.error_reply('EMQSTATE not a job row') end
local state = row[1]
if state == 'pending' then
  -- XX: only rescore; a row that says pending outside its set (a D6 violation) is refused.
  if not rcall('ZSCORE', waiting_key(base, row[2]), id) then
    return redis.error_reply('EMQSTATE not waiting or scheduled (pending, in no waiting set)')
  end
  rcall('ZADD', waiting_key(base, row[2]), 'XX', pri, id)
elseif state ~= 'scheduled' or not rcall('ZSCORE', base .. 'schedule', id) then
  return redis.error_reply('EMQSTATE not waiting or scheduled (' .. tostring(state) .. ')')
end
if pri == 0 then rcall('HDEL', jk, 'priority') else rcall('HSET', jk, 'priority', pri) end
return 1
