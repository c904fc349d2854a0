-- The prelude: the helpers every script may use, defined once. scripts.go
-- joins it to each script's body at init (after a peek's flags line, which
-- must stay first), so each script is still one text with one SHA1, fixed
-- by the binary, and reads as one text in EVAL or SCRIPT DEBUG. Line
-- numbers in a script's error messages count from the top of that text.
--
-- Above this comment Go writes the bounds, from quotad/limits:
--   MAX_LIMIT             a limit, a cost, a rate, a burst
--   MAX_WINDOW_MS         a window, a period, a lease, a dedupe horizon
--   MAX_LEASES            a concurrency limit
--   MAX_REQUEST_ID_BYTES  a request id's length
--   MAX_REQUEST_IDS       a max_ids argument
--   MAX_EXACT             2^53 - 1, the largest integer a double holds exactly
--   REQUEST_ID_RULE       the message that refuses a request id
--
-- Nothing here calls Redis until a script calls it, and nothing here
-- writes. Redis runs the whole text on every call, and that shapes it:
-- each helper is a closure made again on each run, and one that refers to
-- a local costs more, so there are few helpers, and only five refer to a
-- local: muldiv (quorem, so that the exact division is written once for
-- both kinds of arithmetic), and, each worth more than the upvalue costs,
-- redis_now (the instant it read), num (the decimals it read), gcra and
-- sliding_window (the helpers each made for a bucket's shape or a window,
-- made only when called and kept for the call's later decisions). The
-- checks of each script's arguments stay in the script, as plain code over
-- num, dec and the bounds, and every error reply goes through fail. A call
-- of a C function (tonumber, string.*, math.*) costs more than a closure,
-- so dec and redis_now convert with arithmetic, and patterns use
-- string.find and %d.

-- A canonical decimal in lo..hi, else nil; s is a string, or nil or false
-- (a field HMGET did not find, a pattern that did not match). The pattern
-- refuses what tonumber would take ("0x1", " 1", "1e0", "-1", "1.5"). At
-- most 16 digits: any hi is at most MAX_EXACT, and a longer string or one
-- that tonumber rounds lands above it, so every value returned is exact.
-- In every script's pattern, %d is an ASCII digit (Redis's Lua runs in the
-- C locale), and cheaper to match than [0-9].
local function dec(s, lo, hi)
  if not s or #s > 16 or not (s == '0' or string.find(s, '^[1-9]%d*$')) then
    return nil
  end
  -- Arithmetic converts a string as tonumber does, without a C call.
  local n = s + 0
  if n < lo or n > hi then
    return nil
  end
  return n
end

-- An argument that is a canonical decimal of 1 or more: its value, else
-- false (dec(s, 1, MAX_EXACT)), read once a script call. The decisions of
-- a batch (batch.lua) share their policy's arguments, so after the first
-- each takes its limits' values from NUMS: a table read, not a pattern
-- match and a conversion. Each script checks the value's bounds itself.
local NUMS = {}
local function num(s)
  local n = NUMS[s]
  if n == nil then
    n = dec(s, 1, MAX_EXACT) or false
    NUMS[s] = n
  end
  return n
end

-- Starts the message of the scripts' own WRONGTYPE replies: the key is not
-- the kind of hash the script keeps ('window', 'token bucket', 'lease
-- set'). errors.go tells them from Redis's own WRONGTYPE by it.
local NOT_OURS = 'key is not a quotad '

-- Every error reply the scripts send: its code, its message, and when
-- healed is 1 (the script restored a lost TTL first) the mark that says
-- so, so that the caller can log and count the repair whatever the answer.
local function fail(code, msg, healed)
  if healed == 1 then
    msg = msg .. ' TTL_RESTORED'
  end
  return redis.error_reply(code .. ' ' .. msg)
end

-- The WRONGTYPE guard. A script reads its key once with redis.pcall,
-- rather than a TYPE call before: a key of another type fails that one
-- read. A failed read r is answered failed_read(what, r): our own
-- WRONGTYPE (NOT_OURS .. what) for a key of another type, Redis's error as
-- it is for anything else. Only a failed read calls it.
local function failed_read(what, r)
  if string.sub(r.err, 1, 10) == 'WRONGTYPE ' then
    return redis.error_reply('WRONGTYPE key is not a quotad ' .. what .. ': it holds another type')
  end
  return r
end

-- A request id is 1..MAX_REQUEST_ID_BYTES bytes that match REQUEST_ID;
-- scripts refuse any other with REQUEST_ID_RULE.
local REQUEST_ID = '^[A-Za-z0-9_%-]+$'

-- Redis's clock (TIME): whole microseconds, and whole milliseconds.
-- Microseconds since 1970 stay far below 2^53, so the arithmetic is exact
-- (and converts TIME's decimal strings without a C call). TIME is read
-- once a script call: the decisions of a batch (batch.lua) all decide at
-- the call's instant, as Redis expires keys during a script by the time it
-- started, and a call of TIME costs more than most of a decision.
local now_us
local function redis_now()
  if not now_us then
    local t = redis.call('TIME')
    now_us = t[1] * 1000000 + t[2]
  end
  return now_us, (now_us - now_us % 1000) / 1000
end

-- Exact integer division for gcra and sliding_window, with no C call.
-- quorem(n, d) is the quotient and remainder of n / d for 0 <= n, 0 < d,
-- n + d < 2^53: n % d is n - floor(n / d) * d, n / d rounded once, so its
-- floor is off by at most one, and every product and difference is exact.
local function quorem(n, d)
  local r = n % d
  local q = (n - r) / d
  if r < 0 then
    q, r = q - 1, r + d
  elseif r >= d then
    q, r = q + 1, r - d
  end
  return q, r
end

-- floor(a * b / d) and its remainder, exactly, for 0 <= a < 2^31 and
-- 0 <= b, d < 2^32 (d > 0), where a * b may pass 2^53. a = hi * 65536 +
-- lo: hi * b < 2^47, and r1 * 65536 + lo * b < 2^49, so every step is an
-- exact integer.
local function muldiv(a, b, d)
  local lo = a % 65536
  local hi = (a - lo) / 65536
  local q1, r1 = quorem(hi * b, d)
  local q2, r2 = quorem(r1 * 65536 + lo * b, d)
  return q1 * 65536 + q2, r2
end

-- The GCRA arithmetic of a bucket of that shape at now (µs), for the take
-- and the peek. A time is (u, r): u + r/rate microseconds, 0 <= r < rate,
-- so every sum and product is an integer under 2^53 and nothing is
-- rounded: the bucket admits exactly burst + rate * elapsed / period
-- tokens. Its helpers are made when it is called, so a script without a
-- bucket pays for gcra alone, and kept for the call's later decisions (a
-- batch's) on a bucket of the same shape: now is the call's one instant.
local gcras
local function gcra(rate, period, burst, now)
  local kept = gcras and gcras[rate]
  if kept and kept.period == period and kept.burst == burst and kept.now == now then
    return kept
  end
  -- One token lasts period_us / rate = a + b/rate microseconds.
  local period_us = period * 1000
  local a, b = quorem(period_us, rate)
  -- n tokens last span(n). n (a number of tokens) and b are at most
  -- MAX_LIMIT < 2^31, so muldiv is exact where n*b reaches 2^60.
  local function span(n)
    local q, r = muldiv(n, b, rate)
    return n * a + q, r
  end
  local function add(u1, r1, u2, r2)
    local u, r = u1 + u2, r1 + r2
    if r >= rate then
      u, r = u + 1, r - rate
    end
    return u, r
  end
  local function sub(u1, r1, u2, r2)
    local u, r = u1 - u2, r1 - r2
    if r < 0 then
      u, r = u - 1, r + rate
    end
    return u, r
  end
  local function le(u1, r1, u2, r2)
    return u1 < u2 or (u1 == u2 and r1 <= r2)
  end
  -- tau: how long a full bucket lasts.
  local tau_u, tau_r = span(burst)
  local g = {span = span, add = add, sub = sub, le = le, tau_u = tau_u, tau_r = tau_r,
    period = period, burst = burst, now = now}
  gcras = gcras or {}
  gcras[rate] = g
  -- The TAT stored as (tat, rem) and written under the stored policy, as
  -- this shape sees it now. rem counts 1/rate of a µs of the rate it was
  -- written under: for another policy it is rounded up to a whole µs, which
  -- never admits more. A TAT in the past is a full bucket: tokens beyond
  -- the burst never accrue.
  function g.rebase(tat, rem, same_policy)
    if not same_policy then
      if rem > 0 then
        tat = tat + 1
      end
      rem = 0
    end
    if tat < now then
      return now, 0
    end
    return tat, rem
  end
  -- Whole milliseconds from now until (u, r), rounded up; 0 if not after now.
  function g.ms_until(u, r)
    local du, dr = sub(u, r, now, 0)
    if du < 0 then
      return 0
    end
    if dr > 0 then
      du = du + 1
    end
    du = du + 999
    return (du - du % 1000) / 1000
  end
  -- Whole tokens in the bucket when the TAT is (u, r): the most n with
  -- span(n) <= now + tau - TAT. Estimated in floating point, then made exact.
  function g.tokens(u, r)
    local su, sr = sub(now + tau_u, tau_r, u, r)
    if su < 0 then
      return 0
    end
    local n = (su + sr / rate) * rate / period_us
    n = n - n % 1
    if n > burst then
      n = burst
    elseif n < 0 then
      n = 0
    end
    while n < burst do
      local nu, nr = span(n + 1)
      if not le(nu, nr, su, sr) then
        break
      end
      n = n + 1
    end
    while n > 0 do
      local nu, nr = span(n)
      if le(nu, nr, su, sr) then
        break
      end
      n = n - 1
    end
    return n
  end
  return g
end

-- The sliding window's arithmetic, for its take and its peek: the helpers
-- of a window of that many ms, made when first called for that window in
-- a script call (as gcra's, so scripts without a sliding window pay for
-- this one function alone) and kept for the call's later decisions (a
-- batch's) on the same window.
--
-- Time is whole ms of Redis's clock. Periods of window ms are aligned to
-- it: the period holding t starts at t - t % window, so every subject and
-- every sidecar agree on them. At elapsed ms into a period, with prev
-- units accepted in the period before and cur in this one, the use of the
-- last window ms is estimated as prev * (window - elapsed) / window + cur,
-- and a take of cost is accepted iff estimate + cost <= limit. cur and cost
-- being whole, that is share + cur + cost <= limit, share being the first
-- term rounded up, so the scripts compare integers only.
--
-- The weight (window - elapsed) / window is never a float: a float weight
-- (or one scaled to a fixed number of steps) rounds, by an error that grows
-- with prev and the window's length, and would differ between a take and
-- its retry_after_ms. It stays a ratio of integers. prev * (window -
-- elapsed) reaches 2^62, past the 2^53 a double holds exactly, so muldiv
-- (above) forms the product in two halves and every quotient and
-- remainder is exact, for every limit and window the bounds allow.
local sliding_windows
local function sliding_window(window)
  if not sliding_windows then
    sliding_windows = {}
  end
  local w = sliding_windows[window]
  if w then
    return w
  end
  w = {}
  sliding_windows[window] = w
  -- prev's share of the estimate, elapsed ms into a period, rounded up.
  function w.share(prev, elapsed)
    if prev == 0 or elapsed >= window then
      return 0
    end
    local q, r = muldiv(prev, window - elapsed, window)
    if r > 0 then
      q = q + 1
    end
    return q
  end
  -- The counts at now of a hash whose current period started at s, with c
  -- units in it and p in the period before, written under a window of
  -- stored ms: prev, cur, the start of now's period and the ms elapsed in
  -- it. A period that ended a window ago or more counts nothing. A stored
  -- period after now's (Redis's clock went back, as after a failover to a
  -- replica whose clock is behind) counts in full, as at its own start, so
  -- going back in time frees nothing. Under another window (a named
  -- policy's window changed) the periods do not line up: the old estimate
  -- at now, rounded up, becomes the current period's count, so what
  -- counted at the change counts for a window more and nothing is freed.
  function w.state(now, s, c, p, stored)
    local _, off = quorem(now, window)
    local start = now - off
    if stored ~= window then
      local o = sliding_window(stored)
      local prev, cur, _, elapsed = o.state(now, s, c, p, stored)
      return 0, o.share(prev, elapsed) + cur, start, off
    end
    if s == start then
      return p, c, start, off
    elseif s == start - window then
      return c, 0, start, off
    elseif s < start then
      return 0, 0, start, off
    end
    return p, c, s, 0
  end
  -- ms from now until the whole use has slid out: cur counts until the
  -- end of the next period, prev until the end of this one; 0 for none.
  function w.reset(now, prev, cur, start)
    if cur > 0 then
      return start + 2 * window - now
    elseif prev > 0 then
      return start + window - now
    end
    return 0
  end
  -- ms from now until a take of cost fits if nothing else is taken: the
  -- least t >= now with share(t) + cur(t) + cost <= limit; 0 when it fits
  -- now. The estimate only falls with time (prev's weight falls by
  -- 1/window a ms; at the boundary cur becomes prev at full weight and cur
  -- is 0), so the first such instant has a closed form, in this period or
  -- the next:
  --
  --   this period, elapsed x:  prev * (window - x) <= R * window,
  --                            R = limit - cur - cost >= 0
  --                            <=>  x >= window - floor(R * window / prev)
  --   next period, elapsed y:  cur * (window - y) <= R' * window,
  --                            R' = limit - cost >= 0 (cost <= limit)
  --                            <=>  y >= window - floor(R' * window / cur)
  --
  -- A bound of window itself is the start of the period after, where the
  -- take fits. R < prev and R' < cur where muldiv is called, so its
  -- quotient is below window and its bounds hold.
  function w.retry(limit, now, prev, cur, start, elapsed, cost)
    local r = limit - cur - cost
    local at
    if r >= 0 then
      if r >= prev then
        return 0
      end
      at = start + math.max(window - muldiv(r, window, prev), elapsed)
    else
      r = limit - cost
      local y = 0
      if r < cur then
        y = window - muldiv(r, window, cur)
      end
      at = start + window + y
    end
    return math.max(at - now, 0)
  end
  return w
end
