--[[ repeat_fire: enqueue every due occurrence and advance its entry in the same call (D19),
  on the server clock, so any number of callers at once enqueue each occurrence exactly once.
  every_ms entries advance here; a cron entry is advanced only by a compare-and-set the
  client sends (ARGV triples): its next fire is computed by the client's cron library.
  KEYS[1] repeat    ZSET  emq:{q}:repeat
  KEYS[2] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  ARGV[2] limit           > 0, due entries examined per call
  ARGV[3] peek            >= 0: also read that many entries from the head of the queue's flow
                          outbox (D18), so a beat with nothing to do is this one call
  ARGV[4] n               how many (name, old score, next score) triples follow
  ARGV[5..] triples       cron advances: fire `name` and move it to `next` only if its score
                          is still `old` and due (else another caller did it first)
  An occurrence's id is its fire time and the repeat's slot (include/compose.lua); a row
  written before slots gets its slot here, before its first new-style id is computed.
  A repeat with a limit or an end (issue 24) moves to +inf once spent (include/compose.lua).
  Returns {fired, {name, score, cron, tz, ...}, now, {outbox entry, ...}}: the cron entries
    due and not advanced by this call (send them back as triples), the server ms the call ran
    at, and the outbox head
  Flags: writes once
]]
--@include common
--@include admit
--@include control
--@include compose
local base, limit, peek, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local reg = KEYS[1]
local now = now_ms()
local fired = 0
local done = {}
for i = 0, n - 1 do
  local name = ARGV[5 + 3 * i]
  local old, nxt = tonumber(ARGV[6 + 3 * i]), tonumber(ARGV[7 + 3 * i])
  local score = rcall('ZSCORE', reg, name)
  if score and tonumber(score) == old and old <= now then
    fired = fired + fire_repeat(base, name, old, now)
    rcall('ZADD', reg, repeat_next(base, name, nxt), name)
    done[name] = true
  end
end
local needs = {}
local due = rcall('ZRANGEBYSCORE', reg, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #due, 2 do
  local name, score = due[i], tonumber(due[i + 1])
  local spec = hmget(base .. 'repeat:' .. name, 'every_ms', 'cron', 'tz')
  if not spec or (not spec[1] and not spec[2]) then
    -- An entry whose spec is gone can never fire: drop it.
    rcall('ZREM', reg, name)
  elseif spec[1] and spec[1] ~= '' then
    fired = fired + fire_repeat(base, name, score, now)
    rcall('ZADD', reg, repeat_next(base, name, next_every(score, tonumber(spec[1]), now)), name)
  elseif not done[name] then
    needs[#needs + 1] = name
    needs[#needs + 1] = tostring(score)
    needs[#needs + 1] = spec[2] or ''
    needs[#needs + 1] = spec[3] or 'UTC'
  end
end
local outbox = {}
if peek > 0 then outbox = rcall('LRANGE', base .. 'flow:outbox', 0, peek - 1) end
return {fired, needs, now, outbox}
