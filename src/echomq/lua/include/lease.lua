-- lease: the claim core (D4), shared by claim and claim_batch. Needs common.

-- Pop the oldest live job of waiting set g, skipping ghosts (ids whose row is gone), mint the
-- token with HINCRBY attempts, set state active and lease it at `deadline` (server clock).
local function lease_one(base, g, deadline)
  local wk = waiting_key(base, g)
  while true do
    local popped = rcall('ZPOPMIN', wk)
    if #popped == 0 then return nil end
    local id = popped[1]
    local jk = base .. 'job:' .. id
    if rcall('EXISTS', jk) == 1 then
      local att = rcall('HINCRBY', jk, 'attempts', 1)
      -- lease_epoch names the open lease generation: the token that may still settle.
      rcall('HSET', jk, 'state', 'active', 'lease_epoch', att)
      rcall('ZADD', base .. 'active', deadline, id)
      local lane = false
      if g ~= FLAT then
        lane = g
        rcall('HINCRBY', base .. 'gactive', g, 1)
      end
      return {id, rcall('HGET', jk, 'payload'), att, lane}
    end
  end
end

-- Weighted round robin: the ring head is served `gweight` times in a row, then rotated to
-- the back. The turn is kept in meta (rr_lane, rr_n) so a single claim and a batch claim
-- follow the same schedule and weights hold on both paths.
local function charge(base, g)
  local ring = base .. 'ring'
  local meta = base .. 'meta'
  if rcall('LINDEX', ring, 0) ~= g then
    -- g left the ring (emptied, paused, at its limit): its turn is over.
    rcall('HDEL', meta, 'rr_lane', 'rr_n')
    return
  end
  if rcall('LLEN', ring) == 1 then return end
  local w = tonumber(rcall('HGET', base .. 'gweight', g) or '1')
  local turn = rcall('HMGET', meta, 'rr_lane', 'rr_n')
  local n = 1
  if turn[1] == g then n = tonumber(turn[2]) + 1 end
  if n >= w then
    rcall('LMOVE', ring, ring, 'LEFT', 'RIGHT')
    rcall('HDEL', meta, 'rr_lane', 'rr_n')
  else
    rcall('HSET', meta, 'rr_lane', g, 'rr_n', n)
  end
end

-- Claim one job from the ring's head lane (the flat set is the ring entry FLAT). A head that
-- is not serviceable, or turns out empty after its ghosts, leaves the ring and the claim
-- moves on to the next entry, so one call never answers empty while work is claimable.
local function claim_one(base, deadline)
  local ring = base .. 'ring'
  while true do
    local g = rcall('LINDEX', ring, 0)
    if not g then return nil end
    local job = nil
    if serviceable(base, g) then job = lease_one(base, g, deadline) end
    if g == FLAT then sync(base, false) else sync(base, g) end
    if job then
      charge(base, g)
      return job
    end
  end
end
