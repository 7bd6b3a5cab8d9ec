--[[ flow_add: a whole same-queue flow tree in one call (D18): every node is checked before
  any write, then inner nodes land held (`awaiting_children`, in no set, job:<id>:deps = their
  child count) and leaves land pending (their lane), each child row naming its parent.
  KEYS[1] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  ARGV[2] n               nodes, parents before their children
  ARGV[3] mark            the flow's mark, minted by the client once per add_flow (every call
                          of a cross-queue tree gets the same): row field `flow` on every
                          node, so a child counts only toward the parent incarnation it was
                          added with, never a later flow under a re-used parent id
  ARGV[4..] nodes         8 each: id, payload, group ('' flat), parent id ('' for the root),
                          policy ('fp' fail the parent | 'id' ignore), child count, the
                          parent's queue when it is another one (else ''), priority (0..2^21;
                          0 writes no field, include/admit.lua)
  A cross-queue flow is several calls, parents first (one per queue and depth): a call that
  fails leaves the parents already written held, never claimable.
  Issue 24: a parent on this queue records its children on this queue in its row field
  `kids` (their ids, 14 bytes each, concatenated), so remove can take its waiting
  descendants with it.
  Returns 'ok' | error EMQKIND (a non-JOB id) | error EMQSTATE exists <id> (nothing written)
  Flags: writes once
]]
--@include common
--@include admit
--@include control
--@include compose
local base, n, mark = ARGV[1], tonumber(ARGV[2]), ARGV[3]
for i = 0, n - 1 do
  local id = ARGV[4 + 8 * i]
  if string.sub(id, 1, 3) ~= 'JOB' then return redis.error_reply('EMQKIND job id must be JOB-namespaced') end
  if rcall('EXISTS', base .. 'job:' .. id) == 1 then
    return redis.error_reply('EMQSTATE exists ' .. id)
  end
end
local now = now_ms()
local added = tally()
local kids_of, parents = {}, {}  -- issue 24: parent id -> its same-queue children's ids
for i = 0, n - 1 do
  local at = 4 + 8 * i
  local id, payload, g, parent, policy = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
  local kids, pq, pri = tonumber(ARGV[at + 5]), ARGV[at + 6], tonumber(ARGV[at + 7])
  if g == '' then g = false end
  local jk = base .. 'job:' .. id
  if kids > 0 then
    local attempts, was = retired_last(base, id)
    local fields = {'state', 'awaiting_children', 'attempts', attempts, 'payload', payload}
    if g then fields[#fields + 1] = 'group'; fields[#fields + 1] = g end
    if attempts ~= '0' then fields[#fields + 1] = 'floor'; fields[#fields + 1] = attempts end
    -- A held parent keeps its priority for its release (compose.lua flow_release).
    if pri ~= 0 then fields[#fields + 1] = 'priority'; fields[#fields + 1] = pri end
    rcall('HSET', jk, unpack(fields))
    if was then unretire(base, id) end
    -- A new incarnation, as admit() does for a leaf: an earlier one's kept outcome and wake
    -- token under a re-used id must not answer this parent's waiters (PROTOCOL §2.4).
    rcall('DEL', base .. 'result:' .. id, base .. 'notify:' .. id)
    rcall('HSET', jk, 'children', kids, 'flow', mark)
    rcall('SET', jk .. ':deps', kids)
  else
    admit(base, id, payload, g, nil, now, false, pri)
    local key = g or FLAT
    tally_add(added, key, 1)
  end
  if parent ~= '' then rcall('HSET', jk, 'parent', parent, 'parent_policy', policy, 'flow', mark) end
  if pq ~= '' then rcall('HSET', jk, 'parent_queue', pq) end
  if parent ~= '' and pq == '' then
    if not kids_of[parent] then
      kids_of[parent] = {}
      parents[#parents + 1] = parent
    end
    table.insert(kids_of[parent], id)
  end
end
-- A parent written by an earlier call of the same flow (another depth) keeps what it had.
for _, pid in ipairs(parents) do
  local pk = base .. 'job:' .. pid
  if rcall('EXISTS', pk) == 1 then
    rcall('HSET', pk, 'kids', (rcall('HGET', pk, 'kids') or '') .. table.concat(kids_of[pid]))
  end
end
touch_all(base, added)
return 'ok'
