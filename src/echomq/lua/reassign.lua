--[[ reassign: move a waiting (or scheduled) job to lane `dst`; the row's group follows.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] dst             the destination lane
  Returns 'reassigned' | 'noop' (already there) | 0 when gone | error EMQSTATE not pending
  Flags: writes once
]]
--@include common
local base, id, dst = ARGV[1], ARGV[2], ARGV[3]
local jk = KEYS[1]
local row = hmget(jk, 'state', 'group', 'priority')
if not row or not row[1] then return 0 end
local src = row[2]
if src == dst then return 'noop' end
if row[1] == 'scheduled' then
  rcall('HSET', jk, 'group', dst)
  emit(base, 'reassigned', id, 'group', dst, 'from', src or '')
  return 'reassigned'
end
if row[1] ~= 'pending' or rcall('ZREM', waiting_key(base, src), id) == 0 then
  return redis.error_reply('EMQSTATE not pending')
end
sync(base, src)
rcall('HSET', jk, 'group', dst)
rcall('ZADD', waiting_key(base, dst), row[3] or 0, id)  -- its priority comes along
touch(base, dst, 1)
emit(base, 'reassigned', id, 'group', dst, 'from', src or '')
return 'reassigned'
