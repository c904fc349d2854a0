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
-- The key lives until its period's end plus MARGIN_MS (PEXPIREAT), so no
-- window outlives its period by more than that; a later take never reads
-- it, since it names the next period's key.
--
-- No error reply follows a write other than a restored TTL: every argument
-- is checked and the period chosen before Redis is touched, and the paths
-- are those of fixed_window_take.lua (HSET first, then the PEXPIREAT of a
-- new window), so a full Redis (maxmemory) leaves a window untouched or
-- decides in full.

local MARGIN_MS = 1000
-- The longest a period can be: a month of 31 days and a zone change.
local MAX_PERIOD_MS = 32 * 86400000

if #KEYS ~= 3 or #ARGV ~= 10 then
  return invalid('want 3 keys and 10 arguments')
end
local limit_s, cost_s, maxids_s, strict, id, spec = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]

local limit = dec(limit_s, 1, MAX_LIMIT)
if not limit then
  return invalid('limit must be a decimal in 1..' .. MAX_LIMIT)
end
local cost = dec(cost_s, 1, limit)
if not cost then
  return invalid('cost must be a decimal in 1..limit')
end
local maxids = dec(maxids_s, 1, MAX_REQUEST_IDS)
if not maxids then
  return invalid('max request ids must be a decimal in 1..' .. MAX_REQUEST_IDS)
end
if strict ~= '0' and strict ~= '1' then
  return invalid('strict must be 0 or 1')
end
if id ~= '' and not valid_id(id) then
  return invalid_id()
end
if #spec > 128 or string.sub(spec, 1, #limit_s + 1) ~= limit_s .. ':'
    or not string.match(spec, '^[0-9]+:[a-z]+:[A-Za-z0-9_/+%-]+:[a-z-]+:[0-9]+$') then
  return invalid('spec must be limit:period:zone:week_start:jitter_ms')
end
local edges = {}
for i = 1, 4 do
  edges[i] = dec(ARGV[6 + i], 0, MAX_EXACT)
  if not edges[i] or (i > 1 and (edges[i] <= edges[i - 1] or edges[i] - edges[i - 1] > MAX_PERIOD_MS)) then
    return invalid('edges must be 4 increasing decimals, at most ' .. MAX_PERIOD_MS .. ' ms apart')
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
  return redis.error_reply('CLOCK_SKEW redis time ' .. now .. ' ms is outside the periods from ' ..
    edges[1] .. ' to ' .. edges[4] .. ': the sidecar clock is more than a period away from redis')
end
local key, expire_at, reset = KEYS[p], edges[p + 1] + MARGIN_MS, edges[p + 1] - now

local f, e = read('window', 'HMGET', key, 'used', 'policy', 'ids', 'r:' .. id)
if not f then
  return e
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
  redis.call('PEXPIREAT', key, expire_at)
  return {1, cost, 0, reset, 0}
end

local used = dec(f[1], 0, MAX_LIMIT)
local ids = dec(f[3] or '0', 0, MAX_REQUEST_IDS)
if not used or not ids or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[a-z]+:') then
  return not_ours('window', 'a hash with other fields')
end

-- The key names its period, so its end is known whoever wrote it.
local healed = 0
if pttl == -1 then
  redis.call('PEXPIREAT', key, expire_at)
  healed = 1
end

if strict == '1' and f[2] ~= spec then
  return refuse(healed, 'POLICY live window has limit:period:zone:week_start:jitter_ms ' .. f[2])
end

if id ~= '' and f[4] then
  local rc, ru = string.match(f[4], '^([0-9]+):([0-9]+)$')
  ru = dec(ru, 1, MAX_LIMIT)
  if not ru then
    return refuse(healed, 'WRONGTYPE key is not a quotad window: malformed request id record')
  end
  if rc ~= cost_s then
    return refuse(healed, 'CONFLICT request id was accepted with cost ' .. rc)
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
    return refuse(healed, 'REQUEST_IDS_FULL window holds ' .. ids .. ' request ids')
  end
  redis.call('HSET', key, 'used', used, 'policy', spec, 'ids', ids + 1, 'r:' .. id, cost_s .. ':' .. used)
end
if f[2] ~= spec and healed == 0 then
  -- A named policy whose period or zone changed: the window ends with the
  -- period it now counts.
  redis.call('PEXPIREAT', key, expire_at)
end
return {1, used, 0, reset, healed}
