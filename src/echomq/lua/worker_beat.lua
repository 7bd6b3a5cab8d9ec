--[[ worker_beat: one worker's registry entry, written on its beat (never per job), and the
  lapsed entries of workers that stopped beating (a SIGKILL, a lost host) pruned. The two
  keys live only while some worker beats: both expire when the last entry lapses.
  KEYS[1] workers      HASH  emq:{q}:workers      worker id -> its entry (JSON)
  KEYS[2] workers:ttl  ZSET  emq:{q}:workers:ttl  worker id -> the server ms its entry lapses at
  ARGV[1] id                 the worker's id
  ARGV[2] entry              its JSON entry (bounded by the worker: at most 100 held jobs)
  ARGV[3] ttl_ms             > 0
  Returns the server ms of the beat
  Flags: writes replay
]]
--@include common
local now = now_ms()
local gone = rcall('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)
if #gone > 0 then
  rcall('HDEL', KEYS[1], unpack(gone))
  rcall('ZREM', KEYS[2], unpack(gone))
end
rcall('HSET', KEYS[1], ARGV[1], ARGV[2])
rcall('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
local last = rcall('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local keep = math.max(1, tonumber(last[2]) - now)
rcall('PEXPIRE', KEYS[1], keep)
rcall('PEXPIRE', KEYS[2], keep)
return now
