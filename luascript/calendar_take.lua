-- One quota decision on one calendar window. See doc.go for the layout.
--
-- KEYS[1..3]  the window hashes of three consecutive periods: the one
--             holding the sidecar's clock, the one before and the one after
-- ARGV[1]   limit        canonical decimal, 1..MAX_LIMIT
-- ARGV[2]   cost         canonical decimal, 1..limit
-- ARGV[3]   max_ids      canonical decimal, 1..MAX_REQUEST_IDS: cap on r:* records
-- ARGV[4]   strict       "1": a live window with another policy is POLICY
-- ARGV[5]   request_id   "" for none, else 1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]
-- ARGV[6]   spec         "<limit>:<period>:<zone>:<week_start>:<jitter_ms>"
-- ARGV[7..10]  edges     ms of Redis's clock, increasing: KEYS[i] counts
--                        the period from ARGV[6+i] to ARGV[7+i]
--
-- The sidecar knows the time zone; Redis knows the time. The sidecar
-- computes the periods around its own clock (in Go, with its zone
-- database) and this script picks the one holding Redis's TIME, so every
-- sidecar counts the same instant in the same period whatever its own
-- clock says, as long as that clock is within a period of Redis's. When
-- it is not, the reply is CLOCK_SKEW and nothing is written.
--
-- Reply {allowed, used, replay, reset_ms, healed}, integers only; reset_ms
-- is until the period's end. Error replies start with INVALID, CONFLICT,
-- POLICY, WRONGTYPE, REQUEST_IDS_FULL or CLOCK_SKEW.
--
-- The key lives until its period's end plus MARGIN_MS, so no window
-- outlives its period by more than that; a later take never reads it,
-- since it names the next period's key. Its TTL is set with PEXPIRE, the
-- time from Redis's now to then, not PEXPIREAT, so the ACL user the README
-- documents needs no command the other scripts do not.
--
-- No error reply follows a write other than a restored TTL: every argument
-- is checked and the period chosen before Redis is touched, and the paths
-- are those of fixed_window_take.lua (HSET first, then the PEXPIRE of a
-- new window), so a full Redis (maxmemory) leaves a window untouched or
-- decides in full.

local MARGIN_MS = 1000
-- The longest a period can be: a month of 31 days and a zone change.
local MAX_PERIOD_MS = 32 * 86400000

if #KEYS ~= 3 or #ARGV ~= 10 then
  return fail('INVALID', 'want 3 keys and 10 arguments')
end
local limit_s, cost_s, maxids_s, strict, id, spec = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]

-- Every argument but the spec at once, the usual case: one match of them
-- joined by ':' (none of the parts can hold one, so each is matched whole,
-- as dec and the request id's pattern would), then their bounds in
-- arithmetic. A canonical decimal in bounds has at most 16 digits, so each
-- value is exact. Any other arguments go through the checks one by one,
-- which say what is wrong, in the same order; both accept exactly the same
-- arguments.
local limit, cost, maxids, edges
if string.find(limit_s .. ':' .. cost_s .. ':' .. maxids_s .. ':' .. strict .. ':' .. id .. ':' .. ARGV[7] .. ':' ..
    ARGV[8] .. ':' .. ARGV[9] .. ':' .. ARGV[10],
    '^[1-9]%d*:[1-9]%d*:[1-9]%d*:[01]:[A-Za-z0-9_%-]*:[1-9]%d*:[1-9]%d*:[1-9]%d*:[1-9]%d*$') then
  limit, cost, maxids = limit_s + 0, cost_s + 0, maxids_s + 0
  edges = {ARGV[7] + 0, ARGV[8] + 0, ARGV[9] + 0, ARGV[10] + 0}
  if limit > MAX_LIMIT or cost > limit or maxids > MAX_REQUEST_IDS or #id > MAX_REQUEST_ID_BYTES
      or edges[4] > MAX_EXACT or edges[2] <= edges[1] or edges[3] <= edges[2] or edges[4] <= edges[3]
      or edges[2] - edges[1] > MAX_PERIOD_MS or edges[3] - edges[2] > MAX_PERIOD_MS
      or edges[4] - edges[3] > MAX_PERIOD_MS then
    limit, edges = nil, nil
  end
end
if not limit then
  limit = dec(limit_s, 1, MAX_LIMIT)
  if not limit then
    return fail('INVALID', 'limit must be a decimal in 1..' .. MAX_LIMIT)
  end
  cost = dec(cost_s, 1, limit)
  if not cost then
    return fail('INVALID', 'cost must be a decimal in 1..limit')
  end
  maxids = dec(maxids_s, 1, MAX_REQUEST_IDS)
  if not maxids then
    return fail('INVALID', 'max request ids must be a decimal in 1..' .. MAX_REQUEST_IDS)
  end
  if strict ~= '0' and strict ~= '1' then
    return fail('INVALID', 'strict must be 0 or 1')
  end
  if id ~= '' and (#id > MAX_REQUEST_ID_BYTES or not string.find(id, REQUEST_ID)) then
    return fail('INVALID', REQUEST_ID_RULE)
  end
end
if #spec > 128 or string.sub(spec, 1, #limit_s + 1) ~= limit_s .. ':'
    or not string.match(spec, '^[0-9]+:[a-z]+:[A-Za-z0-9_/+%-]+:[a-z-]+:[0-9]+$') then
  return fail('INVALID', 'spec must be limit:period:zone:week_start:jitter_ms')
end
if not edges then
  edges = {}
  for i = 1, 4 do
    edges[i] = dec(ARGV[6 + i], 0, MAX_EXACT)
    if not edges[i] or (i > 1 and (edges[i] <= edges[i - 1] or edges[i] - edges[i - 1] > MAX_PERIOD_MS)) then
      return fail('INVALID', 'edges must be 4 increasing decimals, at most ' .. MAX_PERIOD_MS .. ' ms apart')
    end
  end
end

local _, now = redis_now()
local p
for i = 1, 3 do
  if edges[i] <= now and now < edges[i + 1] then
    p = i
  end
end
if not p then
  return fail('CLOCK_SKEW', 'redis time ' .. now .. ' ms is outside the periods from ' ..
    edges[1] .. ' to ' .. edges[4] .. ': the sidecar clock is more than a period away from redis')
end
local key, ttl, reset = KEYS[p], edges[p + 1] + MARGIN_MS - now, edges[p + 1] - now

local f = redis.pcall('HMGET', key, 'used', 'policy', 'ids', 'r:' .. id)
if f.err then
  return failed_read('window', f)
end
local pttl = redis.call('PTTL', key)

if pttl == -2 then
  -- No window for this period: cost <= limit and max_ids >= 1, so the
  -- first take is accepted.
  if id == '' then
    redis.call('HSET', key, 'used', cost_s, 'policy', spec, 'ids', '0')
  else
    redis.call('HSET', key, 'used', cost_s, 'policy', spec, 'ids', '1', 'r:' .. id, cost_s .. ':' .. cost_s)
  end
  redis.call('PEXPIRE', key, ttl)
  return {1, cost, 0, reset, 0}
end

local used = dec(f[1], 0, MAX_LIMIT)
local ids = dec(f[3] or '0', 0, MAX_REQUEST_IDS)
if not used or not ids or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[a-z]+:') then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end

-- The key names its period, so its end is known whoever wrote it.
local healed = 0
if pttl == -1 then
  redis.call('PEXPIRE', key, ttl)
  healed = 1
end

if strict == '1' and f[2] ~= spec then
  return fail('POLICY', 'live window has limit:period:zone:week_start:jitter_ms ' .. f[2], healed)
end

if id ~= '' and f[4] then
  local rc, ru = string.match(f[4], '^([0-9]+):([0-9]+)$')
  ru = dec(ru, 1, MAX_LIMIT)
  if not ru then
    return fail('WRONGTYPE', NOT_OURS .. 'window: malformed request id record', healed)
  end
  if rc ~= cost_s then
    return fail('CONFLICT', 'request id was accepted with cost ' .. rc, healed)
  end
  return {1, ru, 1, reset, healed}
end

-- A named policy's new limit applies at once against the recorded use.
if used + cost > limit then
  return {0, used, 0, reset, healed}
end

used = used + cost
if id == '' then
  redis.call('HSET', key, 'used', used, 'policy', spec)
else
  if ids >= maxids then
    return fail('REQUEST_IDS_FULL', 'window holds ' .. ids .. ' request ids', healed)
  end
  redis.call('HSET', key, 'used', used, 'policy', spec, 'ids', ids + 1, 'r:' .. id, cost_s .. ':' .. used)
end
if f[2] ~= spec and healed == 0 then
  -- A named policy whose period or zone changed: the window ends with the
  -- period it now counts.
  redis.call('PEXPIRE', key, ttl)
end
return {1, used, 0, reset, healed}
