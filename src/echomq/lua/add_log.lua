--[[ add_log: append a line to the job's log, keeping the newest `keep` lines (0 = all).
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] logs      LIST  emq:{q}:job:<id>:logs
  ARGV[1] line
  ARGV[2] keep            optional, >= 0: the call's own bound, which wins; absent: the
                          row's `keep_logs` (the enqueue option), none there = all
  Returns the number of lines kept | -1 when gone
  Flags: writes once
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return -1 end
local n = rcall('RPUSH', KEYS[2], ARGV[1])
local keep = ARGV[2]
if not keep then keep = rcall('HGET', KEYS[1], 'keep_logs') or '0' end
keep = tonumber(keep)
if keep > 0 and n > keep then
  rcall('LTRIM', KEYS[2], -keep, -1)
  return keep
end
return n
