--[[ clear_logs: drop the job's log lines, keeping the newest `keep` (0 = none).
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] logs      LIST  emq:{q}:job:<id>:logs
  ARGV[1] keep            >= 0
  Returns the number of lines removed | -1 when gone
  Flags: writes replay
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return -1 end
local keep = tonumber(ARGV[1])
local n = rcall('LLEN', KEYS[2])
if n <= keep then return 0 end
if keep == 0 then
  rcall('DEL', KEYS[2])
else
  rcall('LTRIM', KEYS[2], -keep, -1)
end
return n - keep
