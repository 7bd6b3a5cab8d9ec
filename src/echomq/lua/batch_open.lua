--[[ batch_open: a batch (issue 42) is a flow whose parent, its *anchor*, stays open to new
  children until batch_close: the anchor lands held (`awaiting_children`, in no set) with
  `children` 0, deps 1 (the open batch's hold, dropped by batch_close) and row field `batch`
  `open`; its payload is the on_complete callback ('' for none), so its release is that
  callback firing (include/compose.lua batch_done).
  KEYS[1] row       HASH  emq:{q}:job:<id>  (the batch id)
  ARGV[1] base            emq:{q}:
  ARGV[2] id              the batch id: a JOB id the client minted
  ARGV[3] mark            the batch's flow mark (row field `flow`, on every member)
  ARGV[4] payload         the on_complete callback's payload, or '' (a bare batch: its
                          anchor ends at the release)
  ARGV[5] group           the on_complete callback's lane, or ''
  ARGV[6] priority        the on_complete callback's priority (0..2^21)
  ARGV[7] about           the batch's description, or '' (row field `about`)
  ARGV[8] on_success      '' or id NUL lane NUL priority NUL payload (row field `on_success`)
  ARGV[9] on_death        the same (row field `on_death`)
  Returns 'ok' (also for a resend: the row with this mark is the call's first copy landed)
    | error EMQKIND | error EMQSTATE exists <id> (nothing written)
  Flags: writes replay
]]
--@include common
--@include args
shape(1, 9, 9, 'ERR batch_open takes 1 key (row) and 9 args')
local base, id, mark = ARGV[1], ARGV[2], ARGV[3]
if string.sub(id, 1, 3) ~= 'JOB' then return redis.error_reply('EMQKIND job id must be JOB-namespaced') end
local jk = KEYS[1]
if rcall('EXISTS', jk) == 1 then
  if rcall('HGET', jk, 'flow') == mark and rcall('HEXISTS', jk, 'batch') == 1 then return 'ok' end
  return redis.error_reply('EMQSTATE exists ' .. id)
end
local pri = priority_arg(ARGV[6])
local fields = {'state', 'awaiting_children', 'attempts', '0', 'payload', ARGV[4],
  'children', 0, 'flow', mark, 'batch', 'open'}
local function put(name, value)
  if value ~= '' and value ~= 0 and value ~= '0' then
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
end
put('group', ARGV[5])
put('priority', pri)
put('about', ARGV[7])
put('on_success', ARGV[8])
put('on_death', ARGV[9])
rcall('HSET', jk, unpack(fields))
rcall('SET', jk .. ':deps', 1)
return 'ok'
