-- The sliding window's arithmetic, shared by sliding_window_take.lua and
-- sliding_window_peek.lua: slidingwindow.go joins it after the prelude and
-- before each of their bodies. It defines functions only; nothing here
-- calls Redis or writes.
--
-- Time is whole milliseconds of Redis's clock (TIME). Periods of window ms
-- are aligned to that clock: the period holding t starts at t - t % window,
-- so every subject and every sidecar agree on them. At t, elapsed ms into a
-- period, with prev units accepted in the period before and cur in this
-- one, the estimate of the use in the last window ms is
--
--     prev * (window - elapsed) / window + cur
--
-- and a take of cost is accepted iff estimate + cost <= limit. cur and cost
-- being whole, that is exactly share + cur + cost <= limit where share is
-- the first term rounded up, so the scripts compare integers only.
--
-- The weight (window - elapsed) / window is never a float. A float weight
-- (or one scaled to a fixed number of steps) rounds, by an error that grows
-- with prev and with the window's length and differs between the take and
-- its retry_after_ms. Here it stays a ratio of integers: prev * (window -
-- elapsed) reaches 2^62, beyond the 2^53 a double holds exactly, so muldiv
-- forms the product in two halves and every quotient and remainder is
-- exact, for any limit and window the bounds allow.

-- Exact quotient and remainder of n by d, for 0 <= n < 2^53, 0 < d < 2^53.
-- n / d is rounded once, so its floor is off by at most one: corrected.
local function sw_divmod(n, d)
  local q = math.floor(n / d)
  local r = n - q * d
  if r < 0 then
    q, r = q - 1, r + d
  elseif r >= d then
    q, r = q + 1, r - d
  end
  return q, r
end

-- floor(a * b / d) and its remainder, exactly, for 0 <= a < 2^31,
-- 0 <= b < 2^32 and 0 < d < 2^32. a is split as hi * 65536 + lo: hi * b <
-- 2^47, and r1 * 65536 + lo * b < 2^49, so every step is an exact integer.
local function muldiv(a, b, d)
  local hi = math.floor(a / 65536)
  local lo = a - hi * 65536
  local q1, r1 = sw_divmod(hi * b, d)
  local q2, r2 = sw_divmod(r1 * 65536 + lo * b, d)
  return q1 * 65536 + q2, r2
end

-- prev's share of the estimate after elapsed ms of window, rounded up:
-- ceil(prev * (window - elapsed) / window).
local function sw_share(window, prev, elapsed)
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
-- units in it and p in the period before: prev, cur, the start of now's
-- period and the ms elapsed in it. A period that ended a window ago or more
-- counts nothing. A stored period after now's (Redis's clock went back, as
-- after a failover to a replica whose clock is behind) is counted in full,
-- as at its own start, so going back in time never frees capacity.
local function sw_counts(window, now, s, c, p)
  local start = now - select(2, sw_divmod(now, window))
  if s == start then
    return p, c, start, now - start
  elseif s == start - window then
    return c, 0, start, now - start
  elseif s < start then
    return 0, 0, start, now - start
  end
  return p, c, s, 0
end

-- As sw_counts, for a hash written under a window of stored ms. Under
-- another window than this one (a named policy's window changed), the
-- periods do not line up: the old estimate at now, rounded up, becomes the
-- current period's count in full, so what counted at the change keeps
-- counting for at least a window and nothing is freed by the change.
local function sw_state(window, now, s, c, p, stored)
  if stored == window then
    return sw_counts(window, now, s, c, p)
  end
  local prev, cur, _, elapsed = sw_counts(stored, now, s, c, p)
  local start = now - select(2, sw_divmod(now, window))
  return 0, sw_share(stored, prev, elapsed) + cur, start, now - start
end

-- ms from now until the whole use has slid out: cur counts until the end
-- of the next period, prev until the end of this one; 0 for no use.
local function sw_reset(window, now, prev, cur, start)
  if cur > 0 then
    return start + 2 * window - now
  elseif prev > 0 then
    return start + window - now
  end
  return 0
end

-- ms from now until a take of cost fits, if nothing else is taken: the
-- least t >= now with share(t) + cur(t) + cost <= limit. The estimate only
-- falls with time (prev's weight falls by 1/window each ms, then cur
-- becomes prev at full weight and cur is 0), so the first such instant is
-- found in closed form, in this period or the next:
--
--   this period, elapsed x:  prev * (window - x) <= (limit - cur - cost) * window
--                            <=>  x >= window - floor(R * window / prev),
--                            R = limit - cur - cost, when R >= 0;
--   next period, elapsed y:  cur * (window - y) <= (limit - cost) * window
--                            <=>  y >= window - floor(R' * window / cur),
--                            R' = limit - cost >= 0, as cost <= limit.
--
-- A bound of window itself is the start of the period after, where the
-- take fits (share 0 there). Each floor is below window when reached, so
-- muldiv's bounds hold. 0 when it fits now.
local function sw_retry(limit, window, now, prev, cur, start, elapsed, cost)
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
