-- args: the input rule of PROTOCOL §6, shared by every script the native module mirrors, so
-- both executors answer malformed raw input alike. Before anything is read or written:
-- the number of KEYS and ARGV is the script's (shape), the base ARGV[1] holds a non-empty
-- {hash tag} and every key starts with it (no call leaves its slot), and each numeric
-- argument is a decimal integer of at most 15 digits (exact in a Lua number and in the
-- module's 64-bit integers: no float, exponent, sign-less overflow or wrap). A refusal is an
-- ERR reply with the module's own text.
local ERR_NUM = 'ERR a numeric argument is not an integer'

local function refuse(text)
  error({err = text})
end

-- nkeys: the KEYS count; lo, hi: the ARGV count's bounds (hi nil: no upper bound); why: the
-- module's arity text.
local function shape(nkeys, lo, hi, why)
  local n = #ARGV
  if #KEYS ~= nkeys or n < lo or (hi and n > hi) then refuse(why) end
  local base = ARGV[1]
  local open = string.find(base, '{', 1, true)
  local close = open and string.find(base, '}', open + 1, true)
  if not close or close == open + 1 then refuse('ERR base must contain a {hash tag}') end
  for i = 1, nkeys do
    if string.sub(KEYS[i], 1, #base) ~= base then
      refuse('ERR every key must start with the base (ARGV[1]): no cross-slot call')
    end
  end
end

-- A numeric argument as a number, or the refusal.
local function int_arg(s)
  local digits = type(s) == 'string' and string.match(s, '^%-?(%d+)$')
  if not digits or #digits > 15 then refuse(ERR_NUM) end
  return tonumber(s)
end

-- A job priority (0..2^21, lower runs first): an integer argument in range, or the refusal.
local MAX_PRIORITY = 2097152
local function priority_arg(s)
  local p = int_arg(s)
  if p < 0 or p > MAX_PRIORITY then refuse('ERR priority must be 0..2097152') end
  if p == 0 then return 0 end  -- '-0' is 0, never a score of -0 (the module writes '0')
  return p
end

-- A job's log bound (the enqueue option keep_logs, read by add_log): 1..MAX_ARG (15 digits).
local function keep_logs_arg(s)
  local n = int_arg(s)
  if n < 1 then refuse('ERR keep_logs must be 1..999999999999999') end
  return string.format('%d', n)  -- as text: a Lua number is written "%.14g" (1e+15)
end

-- The named option tail (PROTOCOL §6, "The option tail"): a marker, '+opt' (never a dedup
-- id, an id or a number: a '+' is none of them), then name, value pairs. opt_pairs parses
-- ARGV[from..to] (names at from, from + 2, ...) once into {name = value}; a name the script
-- does not take (`known`), or one named twice, is refused before anything is read or
-- written. The caller checks the span's bounds and parity (its arity text).
local OPT_TAIL = '+opt'
local function opt_pairs(from, to, known)
  local o = {}
  for i = from, to, 2 do
    local name = ARGV[i]
    if not known[name] then refuse('EMQARG unknown option in the tail (see PROTOCOL §6)') end
    if o[name] then refuse('EMQARG an option named twice in the tail') end
    o[name] = ARGV[i + 1]
  end
  return o
end

-- Lua '^(%d+):?(%d*)$' (settle's 'c' / 'c:r' counts, a retry's 'max' / 'max:keep_ms'), each
-- number of at most 15 digits: the two numbers (the second nil when empty), or the refusal.
local function count_pair(text, err)
  local a, b = string.match(text, '^(%d+):?(%d*)$')
  if not a or #a > 15 or #b > 15 then refuse(err) end
  return tonumber(a), tonumber(b)
end
