--[[ cancel: cooperative cancel (D22). A waiting or scheduled job is removed at once (exactly
  as remove does it: lanes, the ring and the retired record stay exact, its dedup key is
  released); an active job gets the row field `cancel`, which its holder's next heartbeat
  (extend_many) reports, and the holder dead-letters it with last_error "cancelled".
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  Returns 'removed' | 'signalled' | 'absent' (no row, or nothing runs or waits: dead) |
    error EMQLOCK
  Flags: writes once
]]
--@include common
--@include control
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[1]
local row = hmget(jk, 'state', 'group', 'attempts')
if not row or not row[1] then return 'absent' end
local state, g = row[1], row[2]
if state == 'active' and rcall('ZSCORE', base .. 'active', id) then
  rcall('HSET', jk, 'cancel', '1')
  return 'signalled'
end
if state ~= 'pending' and state ~= 'scheduled' then return 'absent' end
if rcall('EXISTS', jk .. ':lock') == 1 then return redis.error_reply('EMQLOCK job is locked') end
leave_waiting(base, id, g)
if g then leave_waiting(base, id, false) end
rcall('ZREM', base .. 'schedule', id)
release_dedup(base, id, jk)
rcall('DEL', jk, jk .. ':logs')
retire_one(base, id, row[3], now_ms())
return 'removed'
