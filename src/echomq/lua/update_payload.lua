--[[ update_payload: a waiting or scheduled job's payload replaced (issue 24; BullMQ's
  updateData). A job that runs (active), has ended (dead) or awaits its children is refused:
  its payload is what its run saw or will be judged by. A reaped job (pending with an open
  lease, D5) loses that lease's right to settle: its old holder ran the old payload (as a
  debounce fold does, include/control.lua dedup_holder).
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] payload         opaque bytes (the client checks the queue's size limit)
  Returns 1 | 0 when gone | error EMQSTATE not waiting (nothing written)
  Flags: writes replay
]]
--@include common
--@include args
shape(1, 3, 3, 'ERR update_payload takes 1 key (row) and 3 args (base, id, payload)')
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[1]
if rcall('EXISTS', jk) == 0 then return 0 end
local row = hmget(jk, 'state', 'group', 'lease_epoch')
if not row then return redis.error_reply('EMQSTATE not a job row') end
if row[1] ~= 'pending' and row[1] ~= 'scheduled' then
  return redis.error_reply('EMQSTATE not waiting')
end
rcall('HSET', jk, 'payload', ARGV[3])
if row[3] then rcall('HDEL', jk, 'lease_epoch', 'cancel') end
emit_in(base, 'updated', id, row[2])
return 1
