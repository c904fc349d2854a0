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
--
-- Nothing here calls Redis until a script calls it, and nothing here
-- writes.

-- A canonical decimal in lo..hi, else nil. The pattern refuses what
-- tonumber would take ("0x1", " 1", "1e0", "-1", "1.5"). At most 16 digits:
-- any hi is at most MAX_EXACT, and a longer string or one that tonumber
-- rounds lands above it, so every value returned is exact.
local function dec(s, lo, hi)
  if type(s) ~= 'string' or #s > 16 or not (s == '0' or string.match(s, '^[1-9][0-9]*$')) then
    return nil
  end
  local n = tonumber(s)
  if n < lo or n > hi then
    return nil
  end
  return n
end

-- An error reply for an argument the script refuses.
local function invalid(msg)
  return redis.error_reply('INVALID ' .. msg)
end

-- True for a request id: 1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-].
local function valid_id(id)
  return #id >= 1 and #id <= MAX_REQUEST_ID_BYTES and string.match(id, '^[A-Za-z0-9_%-]+$') ~= nil
end

local function invalid_id()
  return invalid('request id must be 1..' .. MAX_REQUEST_ID_BYTES .. ' of A-Z a-z 0-9 _ -')
end

-- The scripts' own WRONGTYPE reply: the key is not the kind of hash the
-- script keeps ('window', 'token bucket', 'lease set'). errors.go tells it
-- from Redis's own WRONGTYPE by 'key is not a quotad '.
local function not_ours(what, why)
  return redis.error_reply('WRONGTYPE key is not a quotad ' .. what .. ': ' .. why)
end

-- The WRONGTYPE guard. Runs one read of a script's key with redis.pcall,
-- rather than a TYPE call before it: a key of another type fails this one
-- read. Answers the read's value, or nil and the reply to return at once:
-- not_ours for a key of another type, Redis's own error for anything else.
local function read(what, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 10) == 'WRONGTYPE ' then
      return nil, not_ours(what, 'it holds another type')
    end
    return nil, r
  end
  return r
end

-- An error reply after the script may have restored a lost TTL (healed is
-- 1): the reply says so, so that the caller can log and count the repair
-- whatever the answer.
local function refuse(healed, msg)
  if healed == 1 then
    msg = msg .. ' TTL_RESTORED'
  end
  return redis.error_reply(msg)
end

-- Redis's clock (TIME): whole microseconds, and whole milliseconds.
-- Microseconds since 1970 stay far below 2^53.
local function redis_now()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return us, math.floor(us / 1000)
end

-- A fixed window's shape: limit per window_ms. Answers the numbers, or nil
-- and the reply to return.
local function window_shape(limit_s, window_s)
  local limit = dec(limit_s, 1, MAX_LIMIT)
  if not limit then
    return nil, invalid('limit must be a decimal in 1..' .. MAX_LIMIT)
  end
  local window = dec(window_s, 1, MAX_WINDOW_MS)
  if not window then
    return nil, invalid('window_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
  end
  return limit, window
end

-- A token bucket's shape: rate per period_ms, burst at most, and a refill
-- time from empty (burst * period_ms / rate) that fits a key's TTL, which
-- bounds every time the bucket stores. Answers the numbers, or nil and the
-- reply to return.
local function bucket_shape(rate_s, period_s, burst_s)
  local rate = dec(rate_s, 1, MAX_LIMIT)
  if not rate then
    return nil, invalid('rate must be a decimal in 1..' .. MAX_LIMIT)
  end
  local period = dec(period_s, 1, MAX_WINDOW_MS)
  if not period then
    return nil, invalid('period_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
  end
  local burst = dec(burst_s, 1, MAX_LIMIT)
  if not burst then
    return nil, invalid('burst must be a decimal in 1..' .. MAX_LIMIT)
  end
  if burst * period > MAX_WINDOW_MS * rate then
    return nil, invalid('burst * period_ms / rate must be at most ' .. MAX_WINDOW_MS)
  end
  return rate, period, burst
end

-- A lease set's shape: limit leases of lease_ms. Answers the numbers, or
-- nil and the reply to return.
local function lease_shape(limit_s, lease_s)
  local limit = dec(limit_s, 1, MAX_LEASES)
  if not limit then
    return nil, invalid('limit must be a decimal in 1..' .. MAX_LEASES)
  end
  local lease = dec(lease_s, 1, MAX_WINDOW_MS)
  if not lease then
    return nil, invalid('lease_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
  end
  return limit, lease
end

-- The GCRA arithmetic of a bucket of that shape at now (µs), for the take
-- and the peek. A time is (u, r): u + r/rate microseconds, 0 <= r < rate,
-- so every sum and product is an integer under 2^53 and nothing is
-- rounded: the bucket admits exactly burst + rate * elapsed / period
-- tokens. Built on call, so scripts that have no bucket pay nothing.
local function gcra(rate, period, burst, now)
  -- Exact integer quotient and remainder for 0 <= n < 2^53, 0 < d < 2^31.
  local function divmod(n, d)
    local q = math.floor(n / d)
    local r = n - q * d
    if r < 0 then
      q, r = q - 1, r + d
    elseif r >= d then
      q, r = q + 1, r - d
    end
    return q, r
  end
  -- One token lasts period_us / rate = a + b/rate microseconds.
  local period_us = period * 1000
  local a, b = divmod(period_us, rate)
  -- n tokens last span(n). n*b can reach 2^60, so it is multiplied in two
  -- halves.
  local function span(n)
    local hi = math.floor(n / 65536)
    local lo = n - hi * 65536
    local q1, r1 = divmod(hi * b, rate)
    local q2, r2 = divmod(r1 * 65536 + lo * b, rate)
    return n * a + q1 * 65536 + q2, r2
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
  local g = {}
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
  -- A take of cost on the TAT (u, r): the TAT after it, the time it is
  -- due (TAT + span(cost) - tau), and whether it is accepted: iff that time
  -- is not after now.
  function g.take(u, r, cost)
    local nu, nr = add(u, r, span(cost))
    local au, ar = sub(nu, nr, tau_u, tau_r)
    return nu, nr, au, ar, le(au, ar, now, 0)
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
    return math.floor((du + 999) / 1000)
  end
  -- Whole tokens in the bucket when the TAT is (u, r): the most n with
  -- span(n) <= now + tau - TAT. Estimated in floating point, then made exact.
  function g.tokens(u, r)
    local su, sr = sub(now + tau_u, tau_r, u, r)
    if su < 0 then
      return 0
    end
    local n = math.floor((su + sr / rate) * rate / period_us)
    n = math.max(0, math.min(n, burst))
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
