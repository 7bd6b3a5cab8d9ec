--[[ limit_lane: cap lane g's jobs in active at n ('' removes the cap).
  KEYS[1] glimit    HASH  emq:{q}:glimit
  ARGV[1] base            emq:{q}:
  ARGV[2] g
  ARGV[3] n               > 0, or '' for no limit
  Returns 1
  Flags: writes replay
]]
--@include common
if ARGV[3] == '' then
  rcall('HDEL', KEYS[1], ARGV[2])
else
  rcall('HSET', KEYS[1], ARGV[2], ARGV[3])
end
touch(ARGV[1], ARGV[2], 0)
return 1
