--[[ repeat_resume: resume a paused repeatable job (issue 26): its next fire is computed
  afresh from the server clock, never from the schedule it had when it was paused (the
  fires it missed are not made up): every_ms: now + every_ms; cron: the first fire after
  the server's now, computed by the client (as repeat_set's ARGV[7]) from the spec's cron
  and tz, which the call names so that a spec changed in between is not resumed on the old
  schedule. A repeat with a limit it has reached, or an end that has passed, stays at +inf
  (spent). A repeat that is not paused is left as it is (its phase kept).
  KEYS[1] repeat    ZSET  emq:{q}:repeat
  KEYS[2] spec      HASH  emq:{q}:repeat:<name>
  ARGV[1] name
  ARGV[2] cron            the spec's cron expression the client read, or '' for every_ms
  ARGV[3] tz              the spec's time zone the client read ('' for every_ms)
  ARGV[4] first_ms        the cron entry's next fire after the server's now, or ''
  Returns 1 when the repeat is registered (resumed, or it was not paused) | 0 when no
    repeat has that name | -1 when the spec's cron or tz is no longer the one ARGV names
    (read them again and resend); 0 and -1 write nothing | error EMQARG a cron resume
    without first_ms (nothing written)
  Flags: writes replay
]]
--@include common
--@include compose
local name, cron, tz, first = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local spec = rcall('HMGET', KEYS[2], 'every_ms', 'cron', 'tz', 'paused', 'limit', 'until_ms',
  'fired')
local every = spec[1] or ''
if every == '' and not spec[2] then return 0 end
if spec[4] ~= '1' then return 1 end
if (spec[2] or '') ~= cron or (cron ~= '' and (spec[3] or 'UTC') ~= tz) then return -1 end
local score
if every ~= '' then
  score = now_ms() + tonumber(every)
else
  score = tonumber(first)
  if not score then return redis.error_reply('EMQARG resume of a cron repeat needs first_ms') end
end
if repeat_spent({limit = spec[5], until_ms = spec[6], fired = spec[7]}, score) then
  score = '+inf'
end
rcall('HDEL', KEYS[2], 'paused')
rcall('ZADD', KEYS[1], score, name)
return 1
