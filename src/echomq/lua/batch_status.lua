--[[ batch_status: one snapshot of a batch (issue 42), read from its anchor.
  KEYS[1] row       HASH  emq:{q}:job:<id>  (the batch id)
  ARGV[1] base            emq:{q}:
  ARGV[2] limit           the most failed member ids returned
  Returns {batch, state, deps, succeeded, dead, died, about, children, failed ids...}:
    batch = open | closed | success | complete; state = the anchor's (awaiting_children
    until the release); deps = the anchor's counter (members not settled, + 1 while open);
    died = the first dead member's id or ''; failed ids: at most limit of the dead members
    | nil when no batch has that id
  Flags: reads replay
]]
--@include common
--@include args
shape(1, 2, 2, 'ERR batch_status takes 1 key (row) and 2 args')
local jk = KEYS[1]
local b = hmget(jk, 'batch', 'state', 'died', 'about')
if not b or not b[1] then return false end
local limit = int_arg(ARGV[2])
local dead = rcall('HLEN', jk .. ':unsuccessful')
local out = {b[1], b[2], tonumber(rcall('GET', jk .. ':deps') or '0'),
  rcall('HLEN', jk .. ':processed'), dead, b[3] or '', b[4] or ''}
if dead > 0 and limit > 0 then
  local ids
  if dead <= limit then
    ids = rcall('HKEYS', jk .. ':unsuccessful')
  else
    ids = rcall('HSCAN', jk .. ':unsuccessful', 0, 'COUNT', limit)[2]
  end
  for i = 1, #ids, (dead <= limit) and 1 or 2 do
    if #out - 7 >= limit then break end
    out[#out + 1] = ids[i]
  end
end
return out
