-- mcpgate rate limits: one batch of checks, evaluated atomically.
--
-- A line-by-line port of limit/internal/algo (Eval, Refund, Release): same
-- state meaning, same integer formulas, same results. Change both together;
-- the tests hold the script to algo.
--
-- This file is a library: it defines every function once, and run(keys,
-- args) serves one call. The store loads it two ways (redisstore.go):
--
--   - as a Redis Function library (FUNCTION LOAD; Redis >= 7, Valkey,
--     ElastiCache 7): the text is prefixed with the library's shebang and
--     "local LIB, EOP = true, nil", and run is registered as the function
--     the store calls with FCALL. The functions below are then built once,
--     when the library loads, and a call runs only run and what it calls;
--   - as a script (EVALSHA, EVAL on NOSCRIPT), where functions are missing:
--     the text is prefixed with "local LIB, EOP, EKEYS, EARGV = false,
--     string.sub(ARGV[1], 1, 1), KEYS, ARGV" (EOP: the op) and ends with
--     "return run(EKEYS, EARGV)". The script's body runs on every call, so
--     the meters' and the breakers' functions are built only for the ops
--     that use them (LIB or EOP).
--
-- keys[i]             counter of check i (all keys of one call in one Cluster
--                     slot)
-- op                  't' take, 'r' refund, 'l' release, 'e' renew leases,
--                     'm' take metered, 'a' adjust a meter, 'f' mark a meter flushed,
--                     'U' undo a metered take (below),
--                     and the loop breakers' ops (see breaker.lua): 'b' take and
--                     'n' take metered with a breaker, 'o' report an outcome,
--                     'd' add denials, 'p' release a probe, 'x' reset
-- args[1]             the call's header, one string: "<op> <clock offset>
--                     <cost>[ <lease>]": op as below; the microseconds
--                     added to the server clock (tests only; "0"); the cost
--                     (take, take metered and refund; "0" otherwise); the
--                     lease id, absent when the batch has no concurrency
--                     check
-- args[1 + i]         check i's rule, one string: "<algorithm> <limit>
--                     <period (µs)> <capacity>"; the algorithm's letter is
--                     upper case for a shadow rule
-- args[2 + n]         refund of n checks only, optional: the clock ("now")
--                     of the take being refunded, whose units it gives back
--                     (algo.RefundAt); absent or "": unknown (algo.Refund)
--
-- Usage meters (ops m, a, f; see limit/internal/algo/meter.go, which this
-- ports). The meter key comes after the checks' keys: keys[n+1] for 'm' with
-- n checks (n may be 0), keys[1] for 'a' and 'f'. With b = 1 + n ('m') or
-- b = 1 ('a'), the meter block is:
--   args[b+1] tenant, args[b+2] period, args[b+3] seeded ("1"/"0"),
--   args[b+4] expire time (ms since 1970, for PEXPIREAT),
--   args[b+5..b+8] seed: charged, refunded, calls, refunded calls,
--   args[b+9] quota (0: none),
--   args[b+10] meter cost: what 'm' charges on the meter (c += it) and what
--   the quota must fit (limit.Meter.CostFor; the checks keep the header's
--   cost); 'a' sends 0 and ignores it,
--   and for 'a' args[b+11..b+14] the delta.
-- For 'f', args[2..5] is the flushed snapshot and args[6] the generation id
-- it was read from (absent: any, as callers before generations sent).
--
-- Idempotent ops (limit.Meter.Op): 'M', 'N' and 'A' are 'm', 'n' and 'a'
-- with an op id. Their last key is the op's marker (keyspace.MeterOp, in
-- the meter's slot) and their last 2 ARGV are: the marker's TTL (ms), then
-- for 'A' the replay guard (limit.Replay) as one string, "<c> <r> <n> <rn>
-- <generation id>": the usage after the op in the generation it was
-- applied in, and that generation's id, which may be empty (a meter of no
-- generation); "" for no guard ('M', 'N' and 'U' send ""). When the marker exists the call applies nothing and replies
-- what the marker holds: the reply of the call that applied the op.
-- Otherwise the call runs as its lower-case op and, when it charged or
-- adjusted the meter, writes the marker with its reply (packed: see
-- record) and the TTL. A replay whose generation is
-- the meter's, or whose usage after is held by the meter's seed in a field
-- the delta raises, applies nothing either (status 5) and is recorded.
-- An 'A' that finds a take's marker ('m', 'n') renames it 'M', 'N': the
-- take's charge now stands for the op placed again.
--
-- 'U' undoes the metered take of an op (a Cluster request whose global
-- half did not admit, layered.go): it is 'A' with the refund as its delta
-- and no replay guard, applied only when the op's marker is a take's ('m'
-- or 'n'), which it then deletes in the same call, so that placing the op
-- again charges it afresh. Any other marker, or none, means the take is
-- undone already or stands for the op placed again: it applies nothing
-- (status 5). Sent again after a lost reply, it applies once.
--
-- A meter's generation, field g: "<id> <seed c> <seed r> <seed n> <seed rn>",
-- written when the meter is created from a seed; the id is "t<now>"
-- (algo.GenID).
-- A meter is a hash: c, r, n, rn the live usage (charged, refunded, calls,
-- refunded calls), fc, fr, fn, frn the part flushed to the durable store,
-- t the tenant, p the period and g the generation. Every write of the live usage sets the
-- key's expiry (PEXPIREAT) in the same call; 'f' keeps it.
--
-- Algorithms: f fixed_window, c sliding_window_counter, t token_bucket,
-- g gcra, w sliding_window, k concurrency.
--
-- State (times in µs since 2020-01-01T00:00:00Z, the epoch of "now"):
--   f  string "<window start> <count>"
--   c  string "<window start> <count> <previous window's count>"
--   t  string "<tokens*period> <time of that amount>"
--   g  string "<theoretical arrival time>"
--   w  sorted set, one member per unit, scored by the unit's time
--   k  sorted set, lease id -> lease expiry
-- Every key written gets its TTL here (algo's ExpiresAt, in ms rounded up);
-- a key whose state is back to fresh is deleted instead (algo drops it),
-- but for a bucket full at its own time, ahead of a clock that went back.
--
-- Reply: take    {now, then per check: allowed (1/0), remaining, reset, retry}
--                (reset and retry in µs; a negative value means never)
--        refund, release  {now}
--        renew         {now, number of concurrency checks whose lease was live}
--        take metered  take's reply, then status, c, r, n, rn, g
--        adjust        {now, status, c, r, n, rn, g}
--        mark flushed  {now, 1 marked, 0 no such meter, 2 the meter is of
--                      another generation: nothing marked}
--        breaker ops   see breaker.lua ('b' and 'n' reply take's and take
--                      metered's reply followed by the breaker's block)
-- status (algo.MeterStatus): 0 quota denies, 1 ok, 2 needs a seed,
-- 3 expire time passed, 4 overflow, 5 a replay already counted. On 2, 3, 4
-- and 5 nothing was written, and c..rn are the counter as it stands (0 when
-- there is none), g its generation ("" when there is none).
--
-- Lua numbers are doubles: for rules that pass limit.Rule.Validate every
-- value here is an integer below 2^53, so it is exact. Division goes through
-- idiv, and numbers sent to Redis through int (tostring prints 1e+15, and
-- Redis would format a number argument with too few digits).

-- The call being served, set by run (a server runs one call at a time).
local KEYS, ARGV, now, op, cost, lease
-- opkey is the marker key of an idempotent op (nil without one); nk and na
-- are #KEYS and #ARGV without the op's key and tail.
local opkey, nk, na

-- The library functions used, read once by the first call (init): a
-- function library's code runs when it loads without the Lua libraries or
-- redis.call.
local floor, min, max, fmt, match, find, sub, call, rpcall, intf, seqf, int2f, int3f

local function init()
  floor, min, max, fmt, match, find, sub = math.floor, math.min, math.max, string.format, string.match, string.find, string.sub
  call, rpcall = redis.call, redis.pcall
  -- int formats an integer for Redis. Lua 5.1's %d casts to C long: exact
  -- on the 64-bit builds Redis and Valkey ship, and three times faster than
  -- %.0f, which is kept for a build whose long is narrower.
  intf = '%d'
  if fmt(intf, 9007199254740992) ~= '9007199254740992' then intf = '%.0f' end
  seqf = '%013' .. string.sub(intf, 2) -- zero-padded sliding-window unit number
  int2f = intf .. ' ' .. intf -- two integers in one string.format: cheaper than two and a concatenation
  int3f = int2f .. ' ' .. intf
end

-- idiv is floor(a / b) for integers a and b > 0. math.floor(a / b) alone is
-- exact for 0 <= a < 2^53 (the quotient is at least 1/b from the next
-- integer, more than its rounding error); the correction keeps it exact at
-- the edge of the bounds, where a + b - 1 in ceildiv may pass 2^53.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceildiv is ceil(a / b), idiv(a + b - 1, b) without a second call.
local function ceildiv(a, b)
  a = a + b - 1
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- int formats an integer for Redis (see init). A function library keeps
-- the strings of -1..1023 once made: replies, markers and meters write many
-- small numbers (flags, statuses, zeros, counts), and a string.format of
-- one costs the server as much as a few dozen Lua instructions.
local smalls = {}
local function int(x)
  local s = smalls[x]
  if s then return s end
  s = fmt(intf, x)
  if LIB and x >= -1 and x < 1024 and s ~= '-0' then smalls[x] = s end
  return s
end

-- px is the TTL of a state that is fresh again at time at: whole ms rounded
-- up, at least 1.
local function px(at) return int(max(1, ceildiv(at - now, 1000))) end

-- raiseUnlessType raises r when it is an error reply other than WRONGTYPE.
local function raiseUnlessType(r)
  if type(r) == 'table' and r.err and not find(r.err, 'WRONGTYPE', 1, true) then error(r) end
end

-- pcall runs a command on a key that may hold another type, left under
-- the same name by a rule whose algorithm changed: that WRONGTYPE comes
-- back as its error reply, which the caller reads as no value. Any other
-- error is raised: NOPERM (an ACL that lacks the command) or OOM must fail
-- the call, not read as a missing key or a lease that is gone. Every
-- redis.pcall (rpcall) of the library goes through it, but for get's and
-- zcount's, on every decision's path, which inline it.
local function pcall(...)
  local r = rpcall(...)
  raiseUnlessType(r)
  return r
end

-- get returns the value of a string key, or nil when it is missing or of
-- another type: a sorted set left under the same name by a rule that used
-- to be sliding_window or concurrency reads as fresh (as it does in algo),
-- rather than failing every call until the old key expires.
local function get(key)
  local v = rpcall('GET', key) -- pcall inlined: every decision reads its states
  if type(v) == 'string' then return v end
  if v then raiseUnlessType(v) end -- false: a missing key, the common case
  return nil
end

-- fields parses a state string: up to three integers, the missing ones 0.
-- The states this library writes (integers joined by single spaces) are
-- split without a pattern, which costs half of matching one; a string
-- tonumber cannot split this way goes through the pattern.
-- All string states share algo.State's fields A, B, C in that order, so a
-- rule whose algorithm changed reads the old state exactly as algo does.
local function fields(v)
  if not v then return nil end
  local p = find(v, ' ', 1, true)
  if not p then
    local a = tonumber(v)
    if a then return a, 0, 0 end
  else
    local q = find(v, ' ', p + 1, true)
    local a, b, c
    if q then
      a, b, c = tonumber(sub(v, 1, p - 1)), tonumber(sub(v, p + 1, q - 1)), tonumber(sub(v, q + 1))
    else
      a, b, c = tonumber(sub(v, 1, p - 1)), tonumber(sub(v, p + 1)), 0
    end
    if a and b and c then return a, b, c end
  end
  local a, b, c = match(v, '^(%-?%d+) ?(%-?%d*) ?(%-?%d*)')
  if not a then return nil end
  return tonumber(a), tonumber(b) or 0, tonumber(c) or 0
end

-- zcount counts the members of a sorted set scored above lo; nil when key
-- holds a string (left by a string-state algorithm: read as fresh, as in
-- algo, and replaced on write).
local function zcount(key, lo)
  local r = rpcall('ZCOUNT', key, '(' .. int(lo), '+inf') -- pcall inlined, as in get
  if type(r) == 'number' then return r end
  raiseUnlessType(r)
  return nil
end

-- algs maps an algorithm's letter, upper case for a shadow rule, to the
-- lower case letter.
local algs = { f = 'f', c = 'c', t = 't', g = 'g', w = 'w', k = 'k', F = 'f', C = 'c', T = 't', G = 'g', W = 'w', K = 'k' }

-- parse reads a check's rule, "<algorithm> <limit> <period> <capacity>",
-- into { algorithm (lower case), limit, period, capacity, shadow }; nil
-- when it is not one.
local function parse(s)
  local a, l, p, c = match(s, '^(%a) (%d+) (%d+) (%d+)$')
  local alg = algs[a]
  if not alg then return nil end
  return { alg, tonumber(l), tonumber(p), tonumber(c), a ~= alg }
end

-- keep stores v as what the argument s parses to in cache c, a table of a
-- function library (a script parses every call), with the entries' count
-- at c[0]: at most 1024, then it starts over. A gateway sends the same few
-- rules and headers again and again, and a table lookup is cheaper than
-- parsing one.
local function keep(c, s, v)
  if not LIB then return end
  if c[0] >= 1024 then
    for k in pairs(c) do c[k] = nil end
    c[0] = 0
  end
  c[s], c[0] = v, c[0] + 1
end
local rules, heads = { [0] = 0 }, { [0] = 0 }

-- head reads the call's header, args[1]: op, clock offset, cost, lease
-- ("" for none). Headers without a lease are kept (keep).
local function head(s)
  local h = heads[s]
  if h then return h[1], h[2], h[3], '' end
  local o, off, c, l = match(s, '^(%a) (%-?%d+) (%d+) ?(.*)$')
  if not o then return nil end
  h = { o, tonumber(off), tonumber(c) }
  if l == '' then keep(heads, s, h) end
  return h[1], h[2], h[3], l
end

-- rule returns check i's parameters: algorithm (lower case), limit, period,
-- capacity, shadow. One argument per rule, rather than one per number,
-- because every argument of a call costs the server as much as a few
-- dozen Lua instructions (docs/benchmarks.md, F.4).
local function rule(i)
  local s = ARGV[1 + i]
  local r = rules[s]
  if not r then
    r = parse(s)
    if not r then error({ err = 'ERR mcpgate limit script: bad rule ' .. tostring(s) }) end
    keep(rules, s, r)
  end
  return r[1], r[2], r[3], r[4], r[5]
end

-- logUnits adds cost units at now to the sliding-window log of key, which
-- holds n live units. Members are "<now>:<n+k>": unique, because every member
-- already scored now is live and numbered at most n (a refund removes the
-- newest, or the newest of its take's time: the highest-numbered ones of a
-- time first; the zero padding makes ties order numerically). ZADD NX never moves an existing unit; should the server clock
-- step back onto a used time, the rare collision is retried with new numbers.
local function logUnits(key, n, units)
  local stamp = int(now)
  local args, added, seq = {}, 0, n
  local function flush()
    if #args > 0 then
      added = added + call('ZADD', key, 'NX', unpack(args))
      args = {}
    end
  end
  local want = units
  while added < want do
    for _ = 1, want - added do
      seq = seq + 1
      args[#args + 1] = stamp
      args[#args + 1] = stamp .. ':' .. fmt(seqf, seq)
      if #args >= 1000 then flush() end -- unpack is limited to a few thousand values
    end
    flush()
  end
end

-- Usage meters ------------------------------------------------------------

local MAXU = 1125899906842624 -- limit.MaxUsage (2^50)

-- As a script, the meter functions are made only for the ops that use
-- them: a plain take does not pay for building their closures.
local meterOpen, meterWrite, recorded, record, takeLayout
if LIB or EOP == 'm' or EOP == 'a' or EOP == 'n' or EOP == 'M' or EOP == 'A' or EOP == 'N' or EOP == 'U' then
  -- meterOpen returns the status of the meter key with block b, its live
  -- usage {c, r, n, rn}, whether it must be created from the seed
  -- (algo.MeterOpen), and its generation ("" when there is none).
  meterOpen = function(key, b)
    if tonumber(ARGV[b + 4]) * 1000 - 1577836800000000 <= now then return 3, { 0, 0, 0, 0 }, false, '' end
    local v = call('HMGET', key, 'c', 'r', 'n', 'rn', 'g')
    if v[1] then
      return 1, { tonumber(v[1]), tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0 }, false, v[5] or ''
    end
    if ARGV[b + 3] ~= '1' then return 2, { 0, 0, 0, 0 }, false, '' end
    local id = 't' .. int(now) -- algo.GenID: never the op's id (a lost generation's op creates a new one)
    return 1, { tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8]) }, true,
      id .. ' ' .. ARGV[b + 5] .. ' ' .. ARGV[b + 6] .. ' ' .. ARGV[b + 7] .. ' ' .. ARGV[b + 8]
  end

  -- meterWrite stores live usage u of the meter key with block b (and, when
  -- it is created, the seed as its flushed part, the tenant and the period),
  -- and sets its expiry.
  meterWrite = function(key, b, u, create, gen)
    if create then
      call('HSET', key, 'c', int(u[1]), 'r', int(u[2]), 'n', int(u[3]), 'rn', int(u[4]),
        'fc', ARGV[b + 5], 'fr', ARGV[b + 6], 'fn', ARGV[b + 7], 'frn', ARGV[b + 8],
        't', ARGV[b + 1], 'p', ARGV[b + 2], 'g', gen)
    else
      call('HSET', key, 'c', int(u[1]), 'r', int(u[2]), 'n', int(u[3]), 'rn', int(u[4]))
    end
    call('PEXPIREAT', key, ARGV[b + 4])
  end

  -- A marker is "\1", the kind of write that made it (see record), the
  -- reply's layout as a struct format and a NUL, then the reply packed
  -- with it: numbers as doubles, exact for the integers below 2^53 the
  -- library deals in, strings NUL-terminated (a generation id, a breaker's
  -- reason: never a NUL). Written as text, with a string.format and a
  -- type() per value, a metered take's ~20 numbers cost redis-server more
  -- than the rest of the take (docs/benchmarks.md, F.4). Markers of
  -- earlier versions are text: the kind, then each value, each followed
  -- by "\n"; they are read, and written again as text.

  -- recorded returns the reply the marker of the op holds, the kind of
  -- write that made it (see record) and its layout (nil for a text
  -- marker), or nil.
  recorded = function()
    local v = call('GET', opkey)
    if not v then return nil end
    if sub(v, 1, 1) ~= '\1' then
      local out, kind = {}, nil
      for x in string.gmatch(v, '([^\n]*)\n') do
        if kind then out[#out + 1] = x else kind = x end
      end
      return out, kind, nil
    end
    local e = find(v, '\0', 3, true)
    local f = sub(v, 3, e - 1)
    local out = { struct.unpack(f, v, e + 1) }
    out[#out] = nil -- unpack's next position
    return out, sub(v, 2, 2), f
  end

  -- record writes the op's marker: the kind of write ('m' or 'n', a take
  -- of that op; 'M' or 'N', such a take the op was placed again over; 'a'
  -- an adjust; 't', a take, from earlier versions), then the reply out,
  -- packed with layout f (see takeLayout), for the TTL. Without f (out is
  -- a text marker's) or past 1 000 values (unpack and struct pass them on
  -- Lua's stack, 8 000 slots at most), it is written as text, as earlier
  -- versions did, which recorded reads as well.
  record = function(kind, out, f)
    local v
    if f and #out <= 1000 then
      v = '\1' .. kind .. f .. '\0' .. struct.pack(f, unpack(out))
    else
      local parts = { kind }
      for i = 1, #out do
        local x = out[i]
        if type(x) == 'number' then x = int(x) end
        parts[i + 1] = x
      end
      v = table.concat(parts, '\n') .. '\n'
    end
    call('SET', opkey, v, 'PX', ARGV[na + 1])
  end

  -- takeLayout is the struct format of the reply of a metered take with n
  -- checks (take's reply, the meter's block, the breaker's block after it
  -- when breaker): every value a number but the generation and the
  -- breaker's reason. Made once per shape.
  local layouts = {}
  takeLayout = function(n, breaker)
    local k = 2 * n + (breaker and 1 or 0)
    local f = layouts[k]
    if not f then
      f = '>' .. string.rep('d', 1 + 4 * n) .. 'ddddds' .. (breaker and 'ddddsddddd' or '')
      layouts[k] = f
    end
    return f
  end
end

--[[breaker.lua]]

-- scratch holds take's tables of per-check numbers, made once.
local scratch = { {}, {}, {}, {}, {}, {}, {} }

-- take serves ops t, m, b and n.
local function take()
  local metered = op == 'm' or op == 'n'
  if opkey then
    local r = recorded()
    if r then return r end
  end
  local n = nk
  if metered then n = n - 1 end

  -- The loop breaker (breaker.lua): an open one denies before anything
  -- else is read.
  local bkey, bp, bst, bexists, probe
  if op == 'b' or op == 'n' then
    bp = brParams(na - 10)
    n = n - 1
    if bp.ident > 0 then n = n - 1 end
    bkey = KEYS[nk - (bp.ident > 0 and 1 or 0)]
    bst, bexists = brRead(bkey)
    local deny, retry
    deny, retry, probe = brGate(bst, bp)
    if deny then
      local out = { now }
      brView(out, bst, bp, false)
      out[2], out[3] = bst.s == 2 and 2 or 1, retry
      out[#out + 1] = bst.d
      return out
    end
  end

  -- the reply, made at its size for up to three checks (a table grown
  -- one value at a time is reallocated at every power of two)
  local out
  if n == 1 then
    out = { now, 0, 0, 0, 0 }
  elseif n == 3 then
    out = { now, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
  elseif n == 2 then
    out = { now, 0, 0, 0, 0, 0, 0, 0, 0 }
  else
    out = { now }
  end
  -- what phase 2 writes for check i: state numbers s1..s3, expiry ex (the
  -- library's tables, reused: phase 1 sets ok[i] and bad[i] for every i,
  -- and the others before phase 2 reads them)
  local ok, s1, s2, s3, ex, bad, al = scratch[1], scratch[2], scratch[3], scratch[4], scratch[5], scratch[6], scratch[7]
  if not LIB then ok, s1, s2, s3, ex, bad, al = {}, {}, {}, {}, {}, {}, {} end
  local admit = true

  -- Phase 1: evaluate every check, reading only.
  for i = 1, n do
    local alg, limit, p, cap, shadow = rule(i)
    local key = KEYS[i]
    -- A cost above capacity can never fit (its retry is never), except for
    -- concurrency, which counts calls, not units.
    local never = cost > cap and alg ~= 'k'
    local cost = cost
    if never then
      -- every such cost is denied alike; clamped as algo does, which keeps
      -- cost*p exact whatever the caller passed
      cost = cap + 1
    end
    local allowed, rem, reset, retry = false, 0, 0, 0
    bad[i] = false

    if alg == 't' then
      local full = cap * p
      local tokens = full
      local a, b = fields(get(key))
      -- the server clock went back (a step, a failover to a lagging
      -- replica): the counter's time does not, and the waits below,
      -- counted from it, are gap longer on the server's clock
      local now, gap = now, 0
      if a and b > now then gap, now = b - now, b end
      if a then
        local elapsed = min(now - b, ceildiv(full, limit))
        tokens = min(full, a + max(0, elapsed) * limit)
      end
      allowed = tokens >= cost * p
      if allowed then
        tokens = tokens - cost * p
      end
      rem = idiv(tokens, p)
      reset = ceildiv(full - tokens, limit)
      if allowed then s1[i], s2[i], ex[i] = tokens, now, now + reset end
      -- a full bucket has nothing to wait for, gap or not
      if reset > 0 then reset = reset + gap end
      if not allowed then retry = ceildiv(cost * p - tokens, limit) + gap end

    elseif alg == 'f' then
      local a, b = fields(get(key))
      local now, gap = now, 0
      if a and a > now then gap, now = a - now, a end -- the clock went back: see 't'
      local ws = idiv(now, p) * p
      local cnt = 0
      if a == ws then cnt = b end
      allowed = cnt + cost <= limit
      if allowed then
        cnt = cnt + cost
        s1[i], s2[i], ex[i] = ws, cnt, ws + p
      end
      rem = limit - cnt
      reset = ws + p - now + gap
      if not allowed then retry = ws + p - now + gap end

    elseif alg == 'c' then
      local a, b, c = fields(get(key))
      local now, gap = now, 0
      if a and a > now then gap, now = a - now, a end -- the clock went back: see 't'
      local ws = idiv(now, p) * p
      local cur, prev = 0, 0
      if a == ws then
        cur, prev = b, c
      elseif a == ws - p then
        prev = b
      end
      local e = now - ws
      -- admitted iff prev*(P-e)/P + cur + cost <= L, in integers
      allowed = prev * (p - e) + (cur + cost) * p <= limit * p
      if allowed then
        cur = cur + cost
        s1[i], s2[i], s3[i], ex[i] = ws, cur, prev, ws + 2 * p
      end
      rem = limit - cur - ceildiv(prev * (p - e), p)
      if cur > 0 then
        reset = ws + 2 * p - now + gap
      elseif prev > 0 then
        reset = ws + p - now + gap
      end
      if not allowed and not never then
        if cur + cost > limit then
          -- wait for the next window, where cur becomes the weighted prev
          retry = ws + p + p - idiv((limit - cost) * p, cur) - now + gap
        else
          retry = ws + p - idiv((limit - cur - cost) * p, prev) - now + gap
        end
      end

    elseif alg == 'g' then
      local t = ceildiv(p, limit)
      local tau = t * cap
      local tat = now
      local a = fields(get(key))
      if a and a > now then tat = a end
      local nxt = tat + cost * t
      allowed = nxt - now <= tau
      if allowed then
        tat = nxt
        s1[i], ex[i] = tat, tat
      end
      -- may be negative when a lowered rule leaves tat far ahead; clamped below
      rem = idiv(tau - (tat - now), t)
      reset = tat - now
      if not allowed then retry = nxt - tau - now end

    elseif alg == 'w' then
      -- units older than a period no longer count
      local lo = now - p
      local cnt = zcount(key, lo)
      if not cnt then
        cnt, bad[i] = 0, true
      end
      allowed = cnt + cost <= limit
      if allowed then
        -- units logged later than now (the clock went back) count until
        -- their own time plus a period: the counter is full again, and the
        -- key lives, until the newest leaves (or it would take them along
        -- while they count). Counting them, none but after a step back,
        -- costs a fraction of reading the newest unit on every take.
        local newest = now
        if cnt > 0 and call('ZCOUNT', key, '(' .. int(now), '+inf') > 0 then
          newest = tonumber(call('ZREVRANGE', key, 0, 0, 'WITHSCORES')[2])
        end
        s1[i], s2[i], ex[i] = cnt, lo, newest + p
        cnt = cnt + cost
        reset = newest + p - now
      elseif cnt > 0 then
        reset = tonumber(call('ZREVRANGE', key, 0, 0, 'WITHSCORES')[2]) + p - now
      end
      rem = limit - cnt
      if not allowed and not never then
        -- the oldest cnt+cost-limit units must leave the window
        local r = call('ZRANGEBYSCORE', key, '(' .. int(lo), '+inf', 'WITHSCORES',
          'LIMIT', int(cnt + cost - limit - 1), 1)
        retry = tonumber(r[2]) + p - now
      end

    elseif alg == 'k' then
      local cnt = zcount(key, now)
      if not cnt then
        cnt, bad[i] = 0, true
      end
      local earliest, latest = -1, -1
      if cnt > 0 then
        earliest = tonumber(call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES',
          'LIMIT', 0, 1)[2])
        latest = tonumber(call('ZREVRANGE', key, 0, 0, 'WITHSCORES')[2])
      end
      allowed = cnt + 1 <= limit
      if allowed then
        cnt = cnt + 1
        latest = max(latest, now + p)
        s1[i] = now + p
      end
      rem = limit - cnt
      -- all slots are free again when the last live lease expires
      reset = latest - now
      -- limit.ConcurrencyRetryHint, or the oldest lease's expiry if sooner
      if not allowed then retry = min(earliest - now, 1000000) end

    else
      return redis.error_reply('ERR mcpgate limit script: unknown algorithm ' .. tostring(alg))
    end

    if never then retry = -1 end
    ok[i], al[i] = allowed, alg
    admit = admit and (allowed or shadow)
    local o = 4 * i - 2
    out[o] = allowed and 1 or 0
    -- a rule lowered by a config reload can leave a counter above its limit
    out[o + 1] = max(0, rem)
    out[o + 2] = reset
    out[o + 3] = retry
  end

  -- The meter (algo.MeterOpen, MeterEval): read only, like phase 1.
  local mkey, mb, mst, mu, mcreate, mgen
  if metered then
    mkey, mb = KEYS[n + 1], 1 + n
    mst, mu, mcreate, mgen = meterOpen(mkey, mb)
    if mst == 1 then
      local mcost = tonumber(ARGV[mb + 10])
      if mu[1] + mcost > MAXU or mu[3] + 1 > MAXU then
        mst = 4
      elseif not (tonumber(ARGV[mb + 9]) == 0 or mu[1] - mu[2] + mcost <= tonumber(ARGV[mb + 9])) then
        mst = 0
      end
    end
    if mst > 2 then mcreate, mgen = false, '' end -- an error: nothing is written
    admit = admit and mst == 1
  end

  -- Phase 2: only when every enforced check allows, charge every check that
  -- allows (shadow ones too: they count as if enforced).
  if admit then
    for i = 1, n do
      if ok[i] then
        local alg, key = al[i], KEYS[i]
        if alg == 't' or alg == 'f' then
          call('SET', key, fmt(int2f, s1[i], s2[i]), 'PX', px(ex[i]))
        elseif alg == 'c' then
          call('SET', key, fmt(int3f, s1[i], s2[i], s3[i]), 'PX', px(ex[i]))
        elseif alg == 'g' then
          call('SET', key, int(s1[i]), 'PX', px(ex[i]))
        elseif alg == 'w' then
          if bad[i] then
            call('DEL', key)
          else
            call('ZREMRANGEBYSCORE', key, '-inf', int(s2[i]))
          end
          logUnits(key, s1[i], cost)
          call('PEXPIRE', key, px(ex[i]))
        else -- 'k'
          if bad[i] then
            call('DEL', key)
          else
            call('ZREMRANGEBYSCORE', key, '-inf', int(now))
          end
          call('ZADD', key, int(s1[i]), lease)
          local latest = tonumber(call('ZREVRANGE', key, 0, 0, 'WITHSCORES')[2])
          call('PEXPIRE', key, px(latest))
        end
      end
    end
  end
  if metered then
    if admit then
      mu[1], mu[3] = mu[1] + tonumber(ARGV[mb + 10]), mu[3] + 1
      meterWrite(mkey, mb, mu, mcreate, mgen)
    elseif mcreate then
      meterWrite(mkey, mb, mu, true, mgen) -- created from the seed whatever the decision
    end
    local o = #out
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = mst, mu[1], mu[2], mu[3], mu[4], mgen
  end
  if bkey then
    -- algo.BreakerAfter; a meter error (status 3, 4) writes nothing
    local v = 0
    if mst == 2 then
      v = 2
    elseif not admit then
      v = 1
    end
    local ckey, calls, opened, counted
    if bp.ident > 0 then
      ckey = KEYS[nk]
      calls = brCalls(ckey)
    end
    local before = bst.d
    if not mst or mst <= 2 then
      opened, counted = brAfter(bst, bp, v, probe, calls, ckey)
      brWrite(bkey, bst, bp, bexists)
      if counted then brSetCalls(ckey, calls) end
    end
    local o = brView(out, bst, bp, opened)
    if probe and v == 0 then out[o + 3] = 1 end
    if counted then out[o + 8] = calls.n end
    out[o + 10] = before
  end
  if opkey and metered and admit then record(op == 'n' and 'n' or 'm', out, takeLayout(n, bkey ~= nil)) end
  return out
end

-- refund serves op r: algo.RefundAt. The take time at is args[2 + n]
-- (n checks); absent or "" it is unknown, as algo's negative at.
local function refund()
  local at = tonumber(ARGV[2 + #KEYS] or '')
  if at and at < 0 then at = nil end
  for i = 1, #KEYS do
    local alg, limit, p, cap = rule(i)
    local key = KEYS[i]
    -- no admitted request was charged more than capacity
    local cost = min(cost, cap)
    local ws = idiv(now, p) * p
    -- tw is the start of the take's window
    local tw = ws
    if at then tw = idiv(at, p) * p end
    if alg == 'f' then
      local a, b = fields(get(key))
      if tw == ws and a == ws then
        b = max(0, b - cost)
        if b == 0 then
          call('DEL', key)
        else
          call('SET', key, fmt(int2f, a, b), 'PX', px(ws + p))
        end
      end
    elseif alg == 'c' then
      local a, b, c = fields(get(key))
      local hit = false
      if a == tw and (tw == ws or tw == ws - p) then
        -- the take's window is the counter's own: its count
        b, hit = max(0, b - cost), true
      elseif a == ws and tw == ws - p then
        -- the counter moved on to the next window: the previous count
        c, hit = max(0, c - cost), true
      end
      if hit then
        if b == 0 and c == 0 then
          call('DEL', key)
        else
          call('SET', key, fmt(int3f, a, b, c), 'PX', px(a + 2 * p))
        end
      end
    elseif alg == 't' then
      local a, b = fields(get(key))
      if a then
        local t = max(now, b) -- the clock went back: see take's 't'
        local full = cap * p
        local elapsed = min(t - b, ceildiv(full, limit))
        local tokens = min(full, a + max(0, elapsed) * limit + cost * p)
        if tokens >= full and t == now then
          call('DEL', key)
        else
          -- full at its own time ahead of now, the bucket keeps that time
          -- until then, lest the interval the clock went back be refilled
          -- a second time
          call('SET', key, fmt(int2f, tokens, t), 'PX', px(t + ceildiv(full - tokens, limit)))
        end
      end
    elseif alg == 'g' then
      local a = fields(get(key))
      if a then
        a = max(now, a - cost * ceildiv(p, limit))
        if a <= now then
          call('DEL', key)
        else
          call('SET', key, int(a), 'PX', px(a))
        end
      end
    elseif alg == 'w' then
      -- ranks [lo, hi) are removed: the newest units, or the newest of the
      -- ones logged at at (a score's members rank by their number)
      local hi = pcall('ZCARD', key)
      if type(hi) == 'number' then
        local lo = 0
        if at then
          hi = call('ZCOUNT', key, '-inf', int(at))
          lo = call('ZCOUNT', key, '-inf', '(' .. int(at))
        end
        lo = max(lo, hi - cost)
        if lo < hi then call('ZREMRANGEBYRANK', key, int(lo), int(hi - 1)) end
      end
    elseif alg == 'k' then
      pcall('ZREM', key, lease)
    end
  end
  return { now }
end

-- release serves op l.
local function release()
  for i = 1, #KEYS do
    if rule(i) == 'k' then pcall('ZREM', KEYS[i], lease) end
  end
  return { now }
end

-- renew serves op e: algo.Renew. A live lease lasts at least a full period
-- from now (never shortened; the key's TTL covers it); a lease that is gone
-- is not taken again.
local function renew()
  local held = 0
  for i = 1, #KEYS do
    local alg, _, p = rule(i)
    if alg == 'k' then
      local exp = pcall('ZSCORE', KEYS[i], lease)
      if type(exp) == 'string' and tonumber(exp) > now then
        held = held + 1
        call('ZADD', KEYS[i], 'XX', int(max(tonumber(exp), now + p)), lease)
        local latest = tonumber(call('ZREVRANGE', KEYS[i], 0, 0, 'WITHSCORES')[2])
        call('PEXPIRE', KEYS[i], px(latest))
      end
    end
  end
  return { now, held }
end

-- covered answers as an adjust that applies nothing: the meter as it
-- stands, status 5.
local function covered()
  local st, u, _, gen = meterOpen(KEYS[1], 1)
  if st == 1 then st = 5 end
  if st > 2 and st < 5 then gen = '' end
  return { now, st, u[1], u[2], u[3], u[4], gen }
end

-- adjust serves ops a and u (see 'U' above): algo.MeterAdjust, add the
-- delta, no quota.
local function adjust()
  local undo = op == 'u'
  if opkey then
    local r, kind, layout = recorded()
    if undo then
      if kind ~= 'm' and kind ~= 'n' then return covered() end
    elseif kind == 'a' then
      return r
    elseif kind == 'm' or kind == 'n' or kind == 'M' or kind == 'N' then
      -- The op was a take that landed (a denied take leaves no marker): its
      -- charge is on the meter, so this placement applies nothing and
      -- answers the take's own meter block (status, usage right after the
      -- charge, generation), as the memory store answers the take's reply:
      -- the caller keeps the op as if that reply had arrived. The block
      -- ends the reply of 'm' and precedes the breaker's 10 values in 'n'.
      -- The take's charge now stands for this placement: an undo of the
      -- take sent earlier and run only now must not give it back.
      if kind == 'm' or kind == 'n' then
        kind = string.upper(kind)
        record(kind, r, layout)
      end
      local b = #r - 5
      if kind == 'N' then b = b - 10 end
      return { now, r[b], r[b + 1], r[b + 2], r[b + 3], r[b + 4], r[b + 5] }
    elseif r then
      -- A take's marker of an earlier version ('t'): its charge is on the
      -- meter, so this placement applies nothing.
      return covered()
    end
  end
  local key = KEYS[1]
  local st, u, create, gen = meterOpen(key, 1)
  local replay = opkey and ARGV[na + 2] or ''
  if st == 1 and replay ~= '' then
    -- a replay (limit.Replay): skipped when this generation counts the op
    -- already, or its seed holds it
    local after = { match(replay, '^(%d+) (%d+) (%d+) (%d+) (.*)$') }
    if not after[5] then
      return redis.error_reply('ERR mcpgate limit script: bad replay ' .. replay)
    end
    -- (algo.MeterReplayed: a meter of no generation has the id "" and
    -- a zero seed)
    if match(gen, '^(%S*)') == after[5] then
      st = 5
    else
      local seed, i = { 0, 0, 0, 0 }, 0
      for x in string.gmatch(gen, '%S+') do
        if i > 0 and i <= 4 then seed[i] = tonumber(x) or 0 end
        i = i + 1
      end
      for j = 1, 4 do
        if tonumber(ARGV[11 + j]) > 0 and seed[j] >= tonumber(after[j]) then st = 5 end
      end
    end
    if st == 5 and create then meterWrite(key, 1, u, true, gen) end
  end
  if st == 1 then
    local nu = {}
    for i = 1, 4 do
      nu[i] = u[i] + tonumber(ARGV[11 + i])
      if nu[i] > MAXU then st = 4 end
    end
    if st == 1 then
      u = nu
      meterWrite(key, 1, u, create, gen)
    end
  end
  if st > 2 and st < 5 then gen = '' end
  local out = { now, st, u[1], u[2], u[3], u[4], gen }
  if undo then
    if st == 1 then call('DEL', opkey) end
  elseif opkey and (st == 1 or st == 5) then
    record('a', out, '>dddddds') -- now, status, usage, generation
  end
  return out
end

-- flushed serves op f: algo.MeterMarkFlushed, raise the flushed part field
-- by field when the meter is the snapshot's generation; a meter that is
-- gone is not created, and the expiry is kept.
local function flushed()
  local key = KEYS[1]
  local v = call('HMGET', key, 'c', 'fc', 'fr', 'fn', 'frn', 'g')
  if not v[1] then return { now, 0 } end
  if ARGV[6] and (match(v[6] or '', '^(%S*)') ~= ARGV[6]) then return { now, 2 } end
  call('HSET', key,
    'fc', int(max(tonumber(v[2]) or 0, tonumber(ARGV[2]))), 'fr', int(max(tonumber(v[3]) or 0, tonumber(ARGV[3]))),
    'fn', int(max(tonumber(v[4]) or 0, tonumber(ARGV[4]))), 'frn', int(max(tonumber(v[5]) or 0, tonumber(ARGV[5]))))
  return { now, 1 }
end

local ops = { t = take, m = take, b = take, n = take, r = refund, l = release, e = renew, a = adjust, f = flushed,
  M = take, N = take, A = adjust, u = adjust,
  o = brUpdate, d = brUpdate, p = brUpdate, x = brReset }

-- sec is the last second TIME gave, and secUs its µs since the epoch of
-- now: it changes once a second, so most calls compare two strings (one
-- pointer, in Lua) instead of parsing one (a tonumber of a string costs the
-- server about as much as a Lua function call doing a dozen sums).
local sec, secUs

-- run serves one call.
local function run(keys, args)
  if not call then init() end
  KEYS, ARGV = keys, args
  local time = call('TIME')
  local s = time[1]
  if s ~= sec then sec, secUs = s, (tonumber(s) - 1577836800) * 1000000 end
  local offset
  op, offset, cost, lease = head(args[1])
  if not op then
    return redis.error_reply('ERR mcpgate limit script: bad header ' .. tostring(args[1]))
  end
  now = secUs + tonumber(time[2]) + offset
  opkey, nk, na = nil, #keys, #args
  if op == 'M' or op == 'N' or op == 'A' or op == 'U' then
    opkey, nk, na = keys[#keys], #keys - 1, #args - 2
    op = string.lower(op)
  end
  local f = ops[op]
  if not f then
    return redis.error_reply('ERR mcpgate limit script: unknown op ' .. tostring(op))
  end
  return f()
end
