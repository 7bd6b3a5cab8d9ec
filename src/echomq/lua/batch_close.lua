--[[ batch_close: no more adds from outside the batch (issue 42); drops the open batch's
  hold on its anchor's deps, so the release (on_complete, on_success) happens here when every
  member has settled already, else in the settle of the last one.
  KEYS[1] row       HASH  emq:{q}:job:<id>  (the batch id)
  ARGV[1] base            emq:{q}:
  ARGV[2] id              the batch id
  Returns 1 (closed now) | 0 (closed before: a resend, or a second close)
    | error EMQSTATE nobatch <id> (no batch has that id: never opened, or finished and gone)
  Flags: writes replay
]]
--@include common
--@include args
--@include control
--@include compose
shape(1, 2, 2, 'ERR batch_close takes 1 key (row) and 2 args')
local base, id = ARGV[1], ARGV[2]
local b = hmget(KEYS[1], 'batch', 'state')
if not b or not b[1] then return redis.error_reply('EMQSTATE nobatch ' .. id) end
if b[1] ~= 'open' then return 0 end
rcall('HSET', KEYS[1], 'batch', 'closed')
if rcall('DECR', KEYS[1] .. ':deps') <= 0 then flow_release(base, id) end
return 1
