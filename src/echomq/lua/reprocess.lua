--[[ reprocess: dead -> pending (a grouped job back to its lane, D6). attempts is kept (it
  is the token: a lower one would be handed out again); the stall count restarts, so a job
  that died stalled gets max_stalled fresh stalls, not one; and `floor` becomes attempts, so
  the retry ceiling (attempts - floor >= max_attempts) gives it a fresh budget. It starts a
  new incarnation: the previous one's kept result, wake token, cancel flag, progress and
  first-claim deadline (`expires`, issue 24) go.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] dead      ZSET  emq:{q}:dead
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  Returns 1 | 0 when gone | error EMQSTATE not dead
  Flags: writes once
]]
--@include common
--@include args
shape(2, 2, 2, 'ERR EMQ.REPROCESS takes 2 keys (row, dead) and 2 args (base, id)')
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[1]
if rcall('EXISTS', jk) == 0 then return 0 end
local row = hmget(jk, 'group', 'attempts')
if not row then return redis.error_reply('EMQSTATE not a job row') end
if rcall('ZREM', KEYS[2], id) == 0 then return redis.error_reply('EMQSTATE not dead') end
local g = row[1]
rcall('HDEL', jk, 'last_error', 'stalled', 'cancel', 'progress', 'expires')
-- A new incarnation: the previous one's kept outcome and wake token must not answer its
-- waiters before this one runs (docs/PROTOCOL.md, the side-key lifecycle).
rcall('DEL', base .. 'result:' .. id, base .. 'notify:' .. id)
if row[2] and row[2] ~= '0' and string.match(row[2], '^[0-9]+$') then
  rcall('HSET', jk, 'floor', row[2])
end
park(base, id, jk, g)
touch(base, g, 1)
emit_in(base, 'reprocessed', id, g)
return 1
