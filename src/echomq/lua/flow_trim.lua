--[[ flow_trim: drop delivered entries from the head of a queue's flow outbox (D18). Entries
  only ever leave from the head, in order, and the delivered ones were read from the head: an
  entry that is not at the head now was trimmed already (by another pump that delivered it
  too), so each is popped only when it is the head, and nothing undelivered is removed.
  KEYS[1] outbox    LIST  emq:{q}:flow:outbox
  ARGV[1..] entries       the delivered entries, in order
  Returns how many were removed
  Flags: writes replay
]]
local removed = 0
for i = 1, #ARGV do
  if redis.call('LINDEX', KEYS[1], 0) == ARGV[i] then
    redis.call('LPOP', KEYS[1])
    removed = removed + 1
  end
end
return removed
