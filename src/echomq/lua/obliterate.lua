--[[ obliterate: delete every key of a paused queue, in budgets (call again with the cursor
  until it answers '0'). Refuses a running queue, and one with active jobs unless forced.
  The meta hash (which holds the pause flag) goes last, so every call sees the queue paused.
  KEYS[1] meta      HASH  emq:{q}:meta
  KEYS[2] active    ZSET  emq:{q}:active
  ARGV[1] base            emq:{q}:   (a glob-safe prefix: queue names have no * ? [ \)
  ARGV[2] force           '1' | '0'
  ARGV[3] cursor          '0' to start
  ARGV[4] budget          > 0, keys examined per call
  Returns {cursor, deleted} | error EMQSTATE not paused | error EMQSTATE active jobs present
  Flags: writes once
]]
local rcall = redis.call
if rcall('HEXISTS', KEYS[1], 'paused') == 0 then return redis.error_reply('EMQSTATE not paused') end
if ARGV[2] ~= '1' and rcall('ZCARD', KEYS[2]) > 0 then
  return redis.error_reply('EMQSTATE active jobs present')
end
local scan = rcall('SCAN', ARGV[3], 'MATCH', ARGV[1] .. '*', 'COUNT', tonumber(ARGV[4]))
local deleted = 0
for _, key in ipairs(scan[2]) do
  if key ~= KEYS[1] then deleted = deleted + rcall('DEL', key) end
end
if scan[1] == '0' then deleted = deleted + rcall('DEL', KEYS[1]) end
return {scan[1], deleted}
