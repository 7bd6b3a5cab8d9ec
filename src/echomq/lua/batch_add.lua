--[[ batch_add: jobs join a batch (issue 42) as children of its anchor with policy 'id' (a
  death counts as settled), the anchor's deps growing by the jobs admitted. Refused whole
  (nothing written) for an id that is not JOB-namespaced, an unknown or finished batch, or a
  closed one: after batch_close only a running member of the batch may add (its own
  unsettled run holds the batch open, so the release cannot have happened).
  KEYS[1] row       HASH  emq:{q}:job:<id>  (the batch id)
  ARGV[1] base            emq:{q}:
  ARGV[2] id              the batch id
  ARGV[3] nonce           the call's nonce: a resend answers the first copy's verdicts
                          (emq:{q}:recent:<nonce>, include/admit.lua mark_many)
  ARGV[4] replay_ms       how long the verdicts are kept for a resend
  ARGV[5] adder           the id of the running member that adds, or ''
  ARGV[6] n               jobs
  ARGV[7..] jobs          4 each: id, payload, group ('' flat), priority (0..2^21)
  Returns one verdict per job: 'enqueued' | 'replayed' (a resend) | error EMQKIND
    | error EMQSTATE nobatch <id> | closed <id> | finished <id> | exists <id> (an id that
    exists, or one this batch counted already: nothing written)
  Flags: writes replay
]]
--@include common
--@include args
--@include admit
shape(1, 6, nil, 'ERR batch_add takes 1 key (row) and 6.. args')
local base, bid, nonce, replay_ms, adder = ARGV[1], ARGV[2], ARGV[3], int_arg(ARGV[4]), ARGV[5]
local n = int_arg(ARGV[6])
local seen = find_many(base, nonce)
if seen then return seen end
local jk = KEYS[1]
local b = hmget(jk, 'batch', 'state', 'flow')
if not b or not b[1] then return redis.error_reply('EMQSTATE nobatch ' .. bid) end
if b[2] ~= 'awaiting_children' then return redis.error_reply('EMQSTATE finished ' .. bid) end
if b[1] ~= 'open' then
  local a = adder ~= '' and hmget(base .. 'job:' .. adder, 'parent', 'flow', 'state')
  if not (a and a[1] == bid and a[2] == b[3] and a[3] == 'active') then
    return redis.error_reply('EMQSTATE closed ' .. bid)
  end
end
if #ARGV ~= 6 + 4 * n then refuse('ERR batch_add takes 4 args per job') end
-- Every job checked before the first write: a refusal writes nothing.
local pris = {}
for i = 0, n - 1 do
  if string.sub(ARGV[7 + 4 * i], 1, 3) ~= 'JOB' then
    return redis.error_reply('EMQKIND job id must be JOB-namespaced')
  end
  pris[i] = priority_arg(ARGV[10 + 4 * i])
  -- An id that exists is no member; nor one this batch counted already (a member completed
  -- and gone, or dead): its settle would find its old record and count nothing.
  local id = ARGV[7 + 4 * i]
  if rcall('EXISTS', base .. 'job:' .. id) == 1 or rcall('HEXISTS', jk .. ':processed', id) == 1
      or rcall('HEXISTS', jk .. ':unsuccessful', id) == 1 then
    return redis.error_reply('EMQSTATE exists ' .. id)
  end
end
local now = now_ms()
local added, verdicts, kids = tally(), {}, {}
for i = 0, n - 1 do
  local at = 7 + 4 * i
  local id, g = ARGV[at], ARGV[at + 2]
  if g == '' then g = false end
  local v = admit(base, id, ARGV[at + 1], g, nil, now, false, pris[i])
  if v == 'enqueued' then
    rcall('HSET', base .. 'job:' .. id, 'parent', bid, 'parent_policy', 'id', 'flow', b[3])
    kids[#kids + 1] = id
    tally_add(added, g or FLAT, 1)
  end
  verdicts[#verdicts + 1] = v
end
if #kids > 0 then
  rcall('INCRBY', jk .. ':deps', #kids)
  rcall('HSET', jk, 'kids', (rcall('HGET', jk, 'kids') or '') .. table.concat(kids))
end
mark_many(base, nonce, verdicts, replay_ms)
touch_all(base, added)
return verdicts
