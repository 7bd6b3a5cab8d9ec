--[[ weight_lane: lane g's fair share; a flooded lane is served w times per ring turn.
  KEYS[1] gweight   HASH  emq:{q}:gweight
  ARGV[1] g
  ARGV[2] w               >= 1 (1 is the default and clears the field)
  Returns 1
  Flags: writes replay
]]
if ARGV[2] == '1' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return 1
