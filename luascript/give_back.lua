-- Gives back what the checks of one slot of a take of several limits
-- consumed, when another slot's checks denied the take or failed: the
-- rollback of a take in steps on a Redis Cluster (see takechecks.go).
-- Joined to the prelude as the other scripts are.
--
-- KEYS      every check's keys, check after check, all in one slot
-- ARGV[1]   n            canonical decimal, 1..MAX_CHECKS: checks
-- ARGV[2]   request_id   1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]
-- ARGV[3]   digest       16 hex digits: the take's set of checks
-- then for each check, as take_checks.lua has them: body, shadow, nkeys,
-- nargs and its take's arguments.
--
-- Reply {given back, one 0 or 1 per check}. A check is given back only
-- when its key holds the record r:<id> that the take wrote, with the
-- take's digest and cost (a concurrency check: its lease l:<id>); its
-- record goes with it, so giving back twice gives back once, and a check
-- whose window has ended since has nothing left to give. What is given
-- back, per algorithm:
--   fixed window, calendar   used falls by the cost;
--   token bucket             the TAT moves back by the cost's span, to no
--                            earlier than now (a full bucket), under the
--                            same rate, period and burst only;
--   sliding window           the count of the period the take was counted
--                            in falls by the cost, if it still counts
--                            (under the same window only);
--   concurrency              the lease is released.
-- A check it cannot give back (the key's limits changed, a read failed)
-- is answered 0 and keeps what it took, until its window, period or
-- lease ends: never more than the take consumed.
--
-- Every argument is checked before Redis is touched. A check is given
-- back by one HSET of fields its take wrote (and ids), then the HDEL of
-- its record, so a full Redis (maxmemory) refuses a give back before it
-- writes anything of it; every error reply comes before any write.

local RECORD = '^(.*):m(%x+):[^:]*$'

if ARGV[2] == '' then
  return fail('INVALID', REQUEST_ID_RULE)
end
--#include checks

local rec = 'r:' .. id

-- The leading fields of a record this take wrote, or nil.
local function ours(v)
  if type(v) ~= 'string' then
    return nil
  end
  local head, d = string.match(v, RECORD)
  if d ~= digest then
    return nil
  end
  return head
end

-- A window's use (fixed window, calendar) falls by cost.
local function window(key, cost_s)
  local f = redis.pcall('HMGET', key, 'used', 'ids', rec)
  if f.err then
    return 0
  end
  local head = ours(f[3])
  local used, ids = dec(f[1], 0, MAX_LIMIT), dec(f[2] or '0', 0, MAX_REQUEST_IDS)
  if not head or string.match(head, '^(%d+):') ~= cost_s or not used or not ids then
    return 0
  end
  redis.call('HSET', key, 'used', string.format('%d', math.max(used - cost_s, 0)), 'ids', string.format('%d', math.max(ids - 1, 0)))
  redis.call('HDEL', key, rec)
  return 1
end

-- Each take's give back, named by its entry in takechecks.go's takeBodies;
-- A(c, name) is check c's argument of that name in its take's contract.
local function A(c, name)
  return c.args[c.body.at[name]]
end

local function give_fixed_window(c)
  return window(c.keys[1], A(c, 'cost'))
end

local function give_calendar(c)
  for j = 1, #c.keys do
    if window(c.keys[j], A(c, 'cost')) == 1 then
      return 1
    end
  end
  return 0
end

local function give_concurrency(c)
  local key = c.keys[1]
  local r = redis.pcall('HDEL', key, 'l:' .. id)
  if type(r) == 'number' and r == 1 and redis.call('HLEN', key) <= 1 then
    redis.call('DEL', key)
  end
  return (type(r) == 'number' and r == 1) and 1 or 0
end

local function give_token_bucket(c)
  local key = c.keys[1]
  local rate_s, period_s, burst_s, cost_s = A(c, 'rate'), A(c, 'period'), A(c, 'burst'), A(c, 'cost')
  local rate, period, burst = dec(rate_s, 1, MAX_LIMIT), dec(period_s, 1, MAX_WINDOW_MS), dec(burst_s, 1, MAX_LIMIT)
  local cost = dec(cost_s, 1, MAX_LIMIT)
  if not (rate and period and burst and cost) or burst * period > MAX_WINDOW_MS * rate then
    return 0
  end
  local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy', 'ids', rec)
  if f.err then
    return 0
  end
  local head = ours(f[5])
  local tat, rem, ids = dec(f[1], 0, MAX_EXACT), dec(f[2], 0, MAX_LIMIT), dec(f[4] or '0', 0, MAX_REQUEST_IDS)
  if not head or string.match(head, '^(%d+):') ~= cost_s or f[3] ~= rate_s .. ':' .. period_s .. ':' .. burst_s
      or not tat or not rem or not ids then
    return 0
  end
  local now = redis_now()
  local g = gcra(rate, period, burst, now)
  local su, sr = g.span(cost)
  local u, r = g.sub(tat, rem, su, sr)
  if g.le(u, r, now, 0) then
    u, r = now, 0
  end
  redis.call('HSET', key, 'tat', string.format('%d', u), 'rem', string.format('%d', r), 'ids', string.format('%d', math.max(ids - 1, 0)))
  redis.call('HDEL', key, rec)
  return 1
end

local function give_sliding_window(c)
  local key = c.keys[1]
  local limit_s, window_s, cost_s = A(c, 'limit'), A(c, 'window'), A(c, 'cost')
  local w = dec(window_s, 1, MAX_WINDOW_MS)
  local f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy', 'ids', rec)
  if not w or f.err then
    return 0
  end
  local head = ours(f[6])
  if not head or f[4] ~= limit_s .. ':' .. window_s then
    return 0
  end
  local rc, _, rx = string.match(head, '^(%d+):(%d+):(%d+)$')
  local s, cur, prev = dec(f[1], 0, MAX_EXACT), dec(f[2], 0, MAX_LIMIT), dec(f[3], 0, MAX_LIMIT)
  local ids, cost, exp = dec(f[5] or '0', 0, MAX_REQUEST_IDS), dec(rc, 1, MAX_LIMIT), dec(rx, 0, MAX_EXACT)
  if rc ~= cost_s or not (s and cur and prev and ids and cost and exp) then
    return 0
  end
  -- The take counted in the period starting at exp - 2 * w.
  local s0 = exp - 2 * w
  if s == s0 then
    cur = math.max(cur - cost, 0)
  elseif s == s0 + w then
    prev = math.max(prev - cost, 0)
  end
  redis.call('HSET', key, 'c', string.format('%d', cur), 'p', string.format('%d', prev), 'ids', string.format('%d', math.max(ids - 1, 0)))
  redis.call('HDEL', key, rec)
  return 1
end

--#give

local out = {}
for i = 1, n do
  out[i] = GIVE[checks[i].body.name](checks[i])
end
return out
