--[[ job_state: where the job is, read from the sets (the truth), not only the row.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  Returns pending | active | scheduled | dead | completed (a kept row, issue 24) |
    awaiting_children | unknown | absent
  Flags: reads replay
]]
local rcall = redis.call
local base, id = ARGV[1], ARGV[2]
local row = redis.pcall('HMGET', KEYS[1], 'state', 'group')
if type(row) ~= 'table' or row.err then row = {} end
if rcall('ZSCORE', base .. 'pending', id) then return 'pending' end
if row[2] and rcall('ZSCORE', base .. 'g:' .. row[2] .. ':pending', id) then return 'pending' end
if rcall('ZSCORE', base .. 'active', id) then return 'active' end
if rcall('ZSCORE', base .. 'schedule', id) then return 'scheduled' end
if rcall('ZSCORE', base .. 'dead', id) then return 'dead' end
if rcall('ZSCORE', base .. 'completed', id) then return 'completed' end
if row[1] == 'awaiting_children' then return 'awaiting_children' end
if rcall('EXISTS', KEYS[1]) == 1 then return 'unknown' end
return 'absent'
