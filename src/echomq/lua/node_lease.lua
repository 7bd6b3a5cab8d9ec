--[[ node_lease: lease (or renew) a mint node for a client's minter (D2, PROTOCOL §1.5), so
  no two live minters of one deployment ever hold the same node: minted ids are unique by
  construction, not by luck.
  KEYS[1] nodes     HASH  {emq}:nodes
  ARGV[1] token           the minter's token (16 hex digits: new per minter, process and fork)
  ARGV[2] start           where the search for a free node starts (0..8191, the client's
                          random pick; the search probes 64 nodes from there)
  ARGV[3] lease_ms        how long the lease lasts on the server clock (1000..600000)
  ARGV[4] hw              the highest id millisecond (ms since the id epoch) the token will
                          mint until it renews again: its promise, kept as the node's floor
  Fields: n:<node> = '<token>:<expires server ms>:<hw>' (the holder and its promise; kept
  after the lease lapses, as the next holder's floor), t:<token> = <node> (the token's
  node, so every concurrent call of one minter gets the same one). A node is free when its
  expiry is past. Taking a node deletes its previous holder's t: field: the hash holds at
  most 2 x 8192 fields. PEXPIRE 24 h on every call: a deployment whose minters all stopped
  a day ago drops it (every id minted under it is a day older than any clock in use).
  Returns {node, floor}: mint only ids whose ms exceeds floor (the highest ms any earlier
    holder of the node promised) | error EMQSTATE no free mint node
  Flags: writes replay
]]
local NODES, PROBES = 8192, 64
local token, start = ARGV[1], tonumber(ARGV[2])
local lease_ms, hw = tonumber(ARGV[3]), tonumber(ARGV[4])
if not string.match(token, '^%x+$') or #token ~= 16 then
  return redis.error_reply('ERR node_lease token must be 16 hex digits')
end
if not start or start ~= math.floor(start) or start < 0 or start >= NODES
  or not lease_ms or lease_ms < 1000 or lease_ms > 600000 or lease_ms ~= math.floor(lease_ms)
  or not hw or hw < 0 or hw ~= math.floor(hw) then
  return redis.error_reply('ERR node_lease takes a start in 0..8191, a lease_ms in 1000..600000, an hw >= 0')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]

local function parse(v)
  if not v then return nil, 0, 0 end
  local who, exp, high = string.match(v, '^(%x+):(%d+):(%d+)$')
  if not who then return nil, 0, 0 end
  return who, tonumber(exp), tonumber(high)
end

-- Take or keep `node` until now + lease_ms; its promise never drops below `high`.
local function hold(node, high, floor)
  redis.call('HSET', key, 'n:' .. node, token .. ':' .. (now + lease_ms) .. ':' .. math.max(hw, high),
    't:' .. token, node)
  redis.call('PEXPIRE', key, 86400000)
  return {node, floor}
end

-- Renewal: the token still holds its node (the same one for every concurrent call). Its
-- own ids are the minter's to keep in order (floor 0); the promise only ever grows.
local mine = tonumber(redis.call('HGET', key, 't:' .. token) or '')
if mine then
  local who, exp, high = parse(redis.call('HGET', key, 'n:' .. mine))
  if who == token and exp >= now then return hold(mine, high, 0) end
end
-- A new lease: a node whose holder's lease is past (or that was never held), preferring
-- one whose last promise is behind the server clock too (its floor then dates no id ahead).
local fields = {}
for i = 0, PROBES - 1 do fields[i + 1] = 'n:' .. ((start + i) % NODES) end
local held = redis.call('HMGET', key, unpack(fields))
local spare, spare_who, spare_high
for i = 1, PROBES do
  local who, exp, high = parse(held[i])
  if not who or exp < now then
    local node = (start + i - 1) % NODES
    if high < now - 1672531200000 or who == token then
      spare, spare_who, spare_high = node, who, high
      break
    end
    if not spare then spare, spare_who, spare_high = node, who, high end
  end
end
if not spare then return redis.error_reply('EMQSTATE no free mint node') end
if spare_who and spare_who ~= token then redis.call('HDEL', key, 't:' .. spare_who) end
-- The floor is the last holder's promise: every id it minted has a ms at or below it. The
-- token's own lapsed node needs none (nobody held it since; the minter keeps its order).
if spare_who == token then return hold(spare, spare_high, 0) end
return hold(spare, spare_high, spare_high)
