-- Loop breakers: a port of limit/internal/algo/breaker.go. This file is not
-- a script of its own: the store splices it into limit.lua in place of the
-- line that names this file, after the helpers (now, int, px, fields, get) and
-- before take, which calls the functions below for ops b and n; run calls
-- brUpdate for ops o, d and p, and brReset for x.
--
-- Ops: b take with a breaker, n take metered with a breaker (both laid out
-- as t and m, with the breaker block as the last 10 ARGV), o report an
-- outcome, d add denials, p release a probe's lease, x reset.
--
-- KEYS for b and n: the checks, the meter (n), the breaker, and the
-- identical-calls counter when the identical count is above 0. For o, d,
-- p and x: KEYS[1] the breaker.
--
-- The breaker block, ARGV[k+1..k+10] (k = na - 10 for b and n, na being
-- #ARGV without an op's tail; k = 1 for o and d): tenant, subject, id,
-- consecutive denials, consecutive failures, identical count (0: no
-- identical-calls key), identical window (µs), cooldown (µs), max cooldown
-- (µs), probe lease (µs); k = 1 for p too.
-- Then for o
-- ARGV[12] failed and ARGV[13] probe ("1"/"0"), for d ARGV[12] the count.
--
-- A breaker is a hash: s phase (0 closed, 1 open, 2 half-open), u until,
-- pu probe lease end, cd cooldown, d denials, f failures, r reason, t
-- tenant, sb subject, id, ik the identical-calls key that opened it and ic
-- its count then, x the time the state may be dropped (algo.BreakerExpiry;
-- state past x reads as missing, and the key's TTL is x). A closed breaker
-- with no counts is deleted. An identical-calls counter is a string
-- "<end of window> <count>" with the window's end as TTL.
--
-- Reply block (9 values): open (1: the breaker denied the call, or for o,
-- d and p would deny one now; 2: the same, because it is half-open with a
-- probe in flight), retry (µs), probe (1: the admitted half-open
-- probe), opened (1: this call opened the breaker), reason, denials,
-- failures, identical, cooldown (µs). b and n reply take's or take
-- metered's reply then the block and one more value, the denials count
-- before the call, or {now, block, denials} when the breaker denied the
-- call (nothing else was read); o, d and p reply {now, block}; x replies
-- {now, 1 if the breaker was held else 0, the key of the counter that
-- opened it or ""}.

local brRead, brParams, brGate, brAfter, brCalls, brSetCalls, brWrite, brView, brUpdate, brReset
if LIB or EOP == 'b' or EOP == 'n' or EOP == 'N' or EOP == 'o' or EOP == 'd' or EOP == 'p' or EOP == 'x' then
  -- brRead returns the state of the breaker key (the zero state when it is
  -- missing or past x) and whether the key exists.
  brRead = function(key)
    local v = redis.call('HMGET', key, 's', 'u', 'pu', 'cd', 'd', 'f', 'r', 'ik', 'ic', 'x')
    local x = tonumber(v[10])
    if not v[1] or not x or x <= now then
      return { s = 0, u = 0, pu = 0, cd = 0, d = 0, f = 0, r = '', ik = '', ic = 0, live = false }, v[1] ~= false
    end
    return {
      s = tonumber(v[1]), u = tonumber(v[2]) or 0, pu = tonumber(v[3]) or 0, cd = tonumber(v[4]) or 0,
      d = tonumber(v[5]) or 0, f = tonumber(v[6]) or 0, r = v[7] or '', ik = v[8] or '', ic = tonumber(v[9]) or 0,
      live = true,
    }, true
  end

  -- brParams reads the block after ARGV[k] (algo.Params).
  brParams = function(k)
    return {
      k = k, den = tonumber(ARGV[k + 4]), fail = tonumber(ARGV[k + 5]), ident = tonumber(ARGV[k + 6]),
      within = tonumber(ARGV[k + 7]), cd = tonumber(ARGV[k + 8]), maxcd = tonumber(ARGV[k + 9]),
      lease = tonumber(ARGV[k + 10]),
    }
  end

  local function open(st, p, reason)
    st.s, st.cd, st.u, st.pu, st.r, st.ik, st.ic = 1, p.cd, now + p.cd, 0, reason, '', 0
  end

  -- brGate: deny, retry, probe (algo.BreakerGate).
  brGate = function(st, p)
    if st.s == 1 then
      if now < st.u then return true, st.u - now, false end
      st.s = 2
    elseif st.s == 2 then
      if now < st.pu then return true, st.pu - now, false end
    else
      return false, 0, false
    end
    st.pu = now + p.lease
    return false, 0, true
  end

  -- brAfter: opened, counted (algo.BreakerAfter); v is 0 admitted, 1
  -- denied, 2 unjudged.
  brAfter = function(st, p, v, probe, calls, ckey)
    if probe and v ~= 0 then st.pu = now end
    if st.s ~= 0 then return false, false end
    if v == 1 then
      st.d = st.d + 1
      if p.den > 0 and st.d >= p.den then
        open(st, p, 'consecutive_denials')
        return true, false
      end
    elseif v == 0 then
      st.d = 0
      if p.ident > 0 then
        if calls.x <= now then calls.n, calls.x = 0, now + p.within end
        calls.n = calls.n + 1
        if calls.n >= p.ident then
          open(st, p, 'identical_calls')
          st.ik, st.ic = ckey, calls.n
          return true, true
        end
        return false, true
      end
    end
    return false, false
  end

  -- brCalls reads an identical-calls counter: {n, x}, zero when missing or
  -- past its window.
  brCalls = function(key)
    local x, n = fields(get(key))
    if not x or x <= now then return { n = 0, x = 0 } end
    return { n = n, x = x }
  end

  brSetCalls = function(key, c)
    redis.call('SET', key, fmt(int2f, c.x, c.n), 'PX', px(c.x))
  end

  -- brWrite stores st under key with its expiry (algo.BreakerExpiry), or
  -- deletes the key (when it exists) if st holds nothing.
  brWrite = function(key, st, p, exists)
    local x
    if st.s == 1 then
      x = st.u + p.maxcd
    elseif st.s == 2 then
      x = max(st.u, st.pu) + p.maxcd
    elseif st.d == 0 and st.f == 0 then
      if exists then redis.call('DEL', key) end
      return
    else
      x = now + p.maxcd
    end
    local k = p.k
    redis.call('HSET', key, 's', int(st.s), 'u', int(st.u), 'pu', int(st.pu), 'cd', int(st.cd),
      'd', int(st.d), 'f', int(st.f), 'r', st.r, 'ik', st.ik, 'ic', int(st.ic), 'x', int(x),
      't', ARGV[k + 1], 'sb', ARGV[k + 2], 'id', ARGV[k + 3])
    redis.call('PEXPIRE', key, px(x))
  end

  -- brView appends the reply block of st to out (algo.BreakerView).
  brView = function(out, st, p, opened)
    local retry, cd = 0, p.cd
    if st.s ~= 0 then cd = st.cd end
    if opened then retry = st.u - now end
    local o = #out
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = 0, retry, 0, opened and 1 or 0, st.r
    out[o + 6], out[o + 7], out[o + 8], out[o + 9] = st.d, st.f, st.ic, cd
    return o
  end

  -- brUpdate serves ops o, d and p.
  brUpdate = function()
    local key, p = KEYS[1], brParams(1)
    local st, exists = brRead(key)
    local opened = false
    local write = true
    if op == 'p' then
      -- algo.BreakerReleaseProbe; anything else is left as it is, expiry
      -- included
      write = st.s == 2 and now < st.pu
      if write then st.pu = now end
    elseif op == 'd' then
      -- algo.BreakerAddDenials
      st.d = st.d + tonumber(ARGV[12])
      if st.s == 0 and p.den > 0 and st.d >= p.den then
        open(st, p, 'consecutive_denials')
        opened = true
      end
    elseif ARGV[12] ~= '1' then
      -- algo.BreakerReport, success
      st.f = 0
      if ARGV[13] == '1' and st.s == 2 then
        st.s, st.u, st.pu, st.cd, st.d, st.r, st.ik, st.ic = 0, 0, 0, 0, 0, '', '', 0
      end
    else
      -- algo.BreakerReport, failure
      st.f = st.f + 1
      if ARGV[13] == '1' and st.s == 2 then
        local cd = min(max(st.cd, p.cd) * 2, p.maxcd)
        st.s, st.cd, st.u, st.pu, st.r = 1, cd, now + cd, 0, 'probe_failed'
        opened = true
      elseif st.s == 0 and p.fail > 0 and st.f >= p.fail then
        open(st, p, 'consecutive_failures')
        opened = true
      end
    end
    if write then brWrite(key, st, p, exists) end
    local out = { now }
    brView(out, st, p, opened)
    -- algo.BreakerBlocking
    if st.s == 1 and now < st.u then
      out[2], out[3] = 1, st.u - now
    elseif st.s == 2 and now < st.pu then
      out[2], out[3] = 2, st.pu - now
    else
      out[2], out[3] = 0, 0
    end
    return out
  end

  -- brReset serves op x.
  brReset = function()
    local st, exists = brRead(KEYS[1])
    if exists then redis.call('DEL', KEYS[1]) end
    return { now, st.live and 1 or 0, st.ik }
  end
end
