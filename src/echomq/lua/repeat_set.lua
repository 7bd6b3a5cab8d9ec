--[[ repeat_set: register or update a repeatable job (D19).
  KEYS[1] repeat    ZSET  emq:{q}:repeat        (name -> next fire, server ms)
  KEYS[2] spec      HASH  emq:{q}:repeat:<name>
  KEYS[3] meta      HASH  emq:{q}:meta          (repeat_slots: slots minted so far)
  KEYS[4] free      LIST  emq:{q}:repeatfree    (slots freed by repeat_remove)
  ARGV[1] name            [A-Za-z0-9._-]{1,128}
  ARGV[2] payload         the occurrences' payload
  ARGV[3] group           lane name, or '' for the flat set
  ARGV[4] every_ms        > 0, or '' for a cron entry
  ARGV[5] cron            a 5-field cron expression, or ''
  ARGV[6] tz              the cron's time zone (IANA name)
  ARGV[7] first_ms        a cron entry's next fire (computed by the client from server TIME)
  ARGV[8] owner           the registering app, or ''
  ARGV[9] base            emq:{q}:
  ARGV[10] limit          optional (issue 24): > 0, the repeat fires at most that many times
                          (counted in its row's `fired`, kept across updates); '' none
  ARGV[11] until_ms       optional: no fire due after this ms (the caller's clock, D10); ''
                          none. A spent repeat (score +inf) registered again with other
                          limits, or another schedule, is scheduled again
  Returns 'registered' | 'updated'. An update that keeps the schedule (every_ms, cron, tz)
    keeps the next fire, so re-registering on every worker start never shifts the phase.
    A paused repeat (field `paused`, repeat_pause) stays paused whatever the update: its
    spec takes the new schedule and its entry stays at +inf until repeat_resume.
    A new name gets its slot (the low 22 bits of its occurrence ids, below 2^21, unique among the
    queue's repeats); an update keeps it, and a row written before slots gets one.
    | error EMQSTATE when all 2^21 slots are held (nothing written)
  Flags: writes replay
]]
--@include common
--@include compose
local name, every, cron, tz = ARGV[1], ARGV[4], ARGV[5], ARGV[6]
local limit, until_ms = ARGV[10] or '', ARGV[11] or ''
local old = rcall('HMGET', KEYS[2], 'every_ms', 'cron', 'tz', 'limit', 'until_ms')
local existed = old[1] ~= false or old[2] ~= false
local same = existed and (old[1] or '') == every and (old[2] or '') == cron and (old[3] or '') == tz
  and (old[4] or '') == limit and (old[5] or '') == until_ms
local has_slot = rcall('HEXISTS', KEYS[2], 'slot') == 1
if not has_slot and rcall('LLEN', KEYS[4]) == 0
    and tonumber(rcall('HGET', KEYS[3], 'repeat_slots') or '0') >= 2097152 then
  return redis.error_reply('EMQSTATE the queue holds 2097152 repeats: unrepeat one first')
end
-- The HSET is the first write (deny-oom): at maxmemory the call is refused whole.
rcall('HSET', KEYS[2], 'payload', ARGV[2], 'every_ms', every, 'cron', cron, 'tz', tz,
  'group', ARGV[3], 'owner', ARGV[8])
-- Issue 24: the limits are fields only when set, so a plain repeat's row is as before.
if limit ~= '' then rcall('HSET', KEYS[2], 'limit', limit) else rcall('HDEL', KEYS[2], 'limit') end
if until_ms ~= '' then
  rcall('HSET', KEYS[2], 'until_ms', until_ms)
else
  rcall('HDEL', KEYS[2], 'until_ms')
end
if not has_slot then repeat_slot(ARGV[9], name) end
if not same or not rcall('ZSCORE', KEYS[1], name) then
  local score
  if every ~= '' then
    local t = rcall('TIME')
    score = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(every)
  else
    score = tonumber(ARGV[7])
  end
  local f = hmget(KEYS[2], 'fired')
  local spec = {fired = f and f[1]}
  if limit ~= '' then spec.limit = limit end
  if until_ms ~= '' then spec.until_ms = until_ms end
  if repeat_spent(spec, score) or rcall('HGET', KEYS[2], 'paused') == '1' then
    score = '+inf'
  end
  rcall('ZADD', KEYS[1], score, name)
end
if existed then return 'updated' end
return 'registered'
