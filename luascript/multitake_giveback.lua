-- Gives back what the checks of one slot of a take of several limits
-- consumed, when another slot's checks denied the take or failed: the
-- rollback of the multi-step take on a Redis Cluster (see multitake.go).
-- Joined to the prelude as the other scripts are.
--
-- KEYS      every check's keys, check after check, all in one slot
-- ARGV[1]   n            canonical decimal, 1..MAX_CHECKS: checks
-- ARGV[2]   request_id   1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]
-- ARGV[3]   digest       16 hex digits: the take's set of checks
-- then for each check, as multitake.lua has them: body, shadow, nkeys,
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

local n = dec(ARGV[1], 1, MAX_CHECKS)
if not n then
  return fail('INVALID', 'want 1..' .. MAX_CHECKS .. ' checks')
end
local id, digest = ARGV[2], ARGV[3]
if #id < 1 or #id > MAX_REQUEST_ID_BYTES or not string.find(id, REQUEST_ID) then
  return fail('INVALID', REQUEST_ID_RULE)
end
if not string.find(digest, '^%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x$') then
  return fail('INVALID', 'digest must be 16 hex digits')
end
local BODIES = {fixed_window_take = true, token_bucket_take = true, concurrency_take = true,
  sliding_window_take = true, calendar_take = true}
local checks, a, k = {}, 4, 1
for i = 1, n do
  local body = ARGV[a]
  local nkeys, nargs = dec(ARGV[a + 2], 1, 3), dec(ARGV[a + 3], 1, 16)
  if not BODIES[body] or not nkeys or not nargs or k + nkeys - 1 > #KEYS or a + 3 + nargs > #ARGV then
    return fail('INVALID', 'check ' .. i .. ': want body, shadow, nkeys, nargs and its arguments')
  end
  local ck, ca = {}, {}
  for j = 1, nkeys do
    ck[j] = KEYS[k + j - 1]
  end
  for j = 1, nargs do
    ca[j] = ARGV[a + 3 + j]
  end
  checks[i] = {body = body, keys = ck, args = ca}
  a, k = a + 4 + nargs, k + nkeys
end
if a - 1 ~= #ARGV or k - 1 ~= #KEYS then
  return fail('INVALID', 'arguments or keys left over after the checks')
end

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

local function give(c)
  local key, A = c.keys[1], c.args
  if c.body == 'fixed_window_take' then
    return window(key, A[3])
  elseif c.body == 'calendar_take' then
    for j = 1, #c.keys do
      if window(c.keys[j], A[2]) == 1 then
        return 1
      end
    end
    return 0
  elseif c.body == 'concurrency_take' then
    local r = redis.pcall('HDEL', key, 'l:' .. id)
    if type(r) == 'number' and r == 1 and redis.call('HLEN', key) <= 1 then
      redis.call('DEL', key)
    end
    return (type(r) == 'number' and r == 1) and 1 or 0
  elseif c.body == 'token_bucket_take' then
    local rate, period, burst = dec(A[1], 1, MAX_LIMIT), dec(A[2], 1, MAX_WINDOW_MS), dec(A[3], 1, MAX_LIMIT)
    local cost = dec(A[4], 1, MAX_LIMIT)
    if not (rate and period and burst and cost) or burst * period > MAX_WINDOW_MS * rate then
      return 0
    end
    local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy', 'ids', rec)
    if f.err then
      return 0
    end
    local head = ours(f[5])
    local tat, rem, ids = dec(f[1], 0, MAX_EXACT), dec(f[2], 0, MAX_LIMIT), dec(f[4] or '0', 0, MAX_REQUEST_IDS)
    if not head or string.match(head, '^(%d+):') ~= A[4] or f[3] ~= A[1] .. ':' .. A[2] .. ':' .. A[3]
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
  elseif c.body == 'sliding_window_take' then
    local w = dec(A[2], 1, MAX_WINDOW_MS)
    local f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy', 'ids', rec)
    if not w or f.err then
      return 0
    end
    local head = ours(f[6])
    if not head or f[4] ~= A[1] .. ':' .. A[2] then
      return 0
    end
    local rc, _, rx = string.match(head, '^(%d+):(%d+):(%d+)$')
    local s, cur, prev = dec(f[1], 0, MAX_EXACT), dec(f[2], 0, MAX_LIMIT), dec(f[3], 0, MAX_LIMIT)
    local ids, cost, exp = dec(f[5] or '0', 0, MAX_REQUEST_IDS), dec(rc, 1, MAX_LIMIT), dec(rx, 0, MAX_EXACT)
    if rc ~= A[3] or not (s and cur and prev and ids and cost and exp) then
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
  return 0
end

local out = {}
for i = 1, n do
  out[i] = give(checks[i])
end
return out
