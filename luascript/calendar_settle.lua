-- Settles an accepted take of one calendar window, in the period holding
-- Redis's clock: the take reserved the cost its record holds, and the work
-- it paid for cost this much. See doc.go for the layout.
--
-- KEYS[1..3]  the window hashes of three consecutive periods, as for
--             calendar_take.lua
-- ARGV[1]   limit        canonical decimal, 1..MAX_LIMIT
-- ARGV[2]   cost         canonical decimal, 0..MAX_LIMIT: the take's actual cost
-- ARGV[3]   strict       "1": a live window with another policy is POLICY
-- ARGV[4]   request_id   1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]: the take's
-- ARGV[5]   spec         "<limit>:<period>:<zone>:<week_start>:<jitter_ms>"
-- ARGV[6..9]  edges      ms of Redis's clock, increasing: KEYS[i] counts
--                        the period from ARGV[5+i] to ARGV[6+i]
--
-- Reply {settled, replay, reserved, used, reset_ms, retry_after_ms, healed},
-- as for fixed_window_settle.lua; reset_ms is until the period's end. A
-- take of an earlier period no longer counts anywhere (takes name the key
-- of the period holding the clock), so its settle is the no-op answer,
-- settled 0. Error replies start with INVALID, CONFLICT, POLICY, WRONGTYPE
-- or CLOCK_SKEW.
--
-- A settle is never limited (used may end above the limit, and saturates
-- at MAX_LIMIT), never creates a window and never moves its end: the only
-- PEXPIRE heals a window without TTL, to its period's end, as the take
-- does.
--
-- No error reply follows a write other than a restored TTL: every argument
-- is checked and the period chosen before Redis is touched, the WRONGTYPE
-- checks of the read come before any write, and the one HSET that applies
-- the settlement (used and s:<id> together) is the last write, so a full
-- Redis (maxmemory) leaves a window as it was (but for a restored TTL) or
-- settles in full.
--
-- Records are read as "<cost>:<used>" followed by nothing or by ':' and
-- fields this script does not know, which it leaves as they are.

local MARGIN_MS = 1000
local MAX_PERIOD_MS = 32 * 86400000

if #KEYS ~= 3 or #ARGV ~= 9 then
  return fail('INVALID', 'want 3 keys and 9 arguments')
end
local limit_s, cost_s, strict, id, spec = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local limit = dec(limit_s, 1, MAX_LIMIT)
if not limit then
  return fail('INVALID', 'limit must be a decimal in 1..' .. MAX_LIMIT)
end
local cost = dec(cost_s, 0, MAX_LIMIT)
if not cost then
  return fail('INVALID', 'cost must be a decimal in 0..' .. MAX_LIMIT)
end
if strict ~= '0' and strict ~= '1' then
  return fail('INVALID', 'strict must be 0 or 1')
end
if id == '' or #id > MAX_REQUEST_ID_BYTES or not string.find(id, REQUEST_ID) then
  return fail('INVALID', REQUEST_ID_RULE)
end
if #spec > 128 or string.sub(spec, 1, #limit_s + 1) ~= limit_s .. ':'
    or not string.match(spec, '^[0-9]+:[a-z]+:[A-Za-z0-9_/+%-]+:[a-z-]+:[0-9]+$') then
  return fail('INVALID', 'spec must be limit:period:zone:week_start:jitter_ms')
end
local edges = {}
for i = 1, 4 do
  edges[i] = dec(ARGV[5 + i], 0, MAX_EXACT)
  if not edges[i] or (i > 1 and (edges[i] <= edges[i - 1] or edges[i] - edges[i - 1] > MAX_PERIOD_MS)) then
    return fail('INVALID', 'edges must be 4 increasing decimals, at most ' .. MAX_PERIOD_MS .. ' ms apart')
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

local f = redis.pcall('HMGET', key, 'used', 'policy', 'r:' .. id, 's:' .. id)
if f.err then
  return failed_read('window', f)
end
local pttl = redis.call('PTTL', key)

-- What a take of 1 would be told: the period's use never falls before it
-- ends.
local function retry(u)
  if u >= limit then
    return reset
  end
  return 0
end

if pttl == -2 then
  return {0, 0, 0, 0, reset, 0, 0}
end

local used = dec(f[1], 0, MAX_LIMIT)
if not used or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[a-z]+:') then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end

local healed = 0
if pttl == -1 then
  redis.call('PEXPIRE', key, ttl)
  healed = 1
end

if strict == '1' and f[2] ~= spec then
  return fail('POLICY', 'live window has limit:period:zone:week_start:jitter_ms ' .. f[2], healed)
end

if not f[3] then
  return {0, 0, 0, used, reset, retry(used), healed}
end
local rc, ru, rest = string.match(f[3], '^(%d+):(%d+)(.*)$')
local reserved = dec(rc, 1, MAX_LIMIT)
if not reserved or not dec(ru, 1, MAX_LIMIT) or rest ~= '' and string.sub(rest, 1, 1) ~= ':' then
  return fail('WRONGTYPE', NOT_OURS .. 'window: malformed request id record', healed)
end

if f[4] then
  local sc, srest = string.match(f[4], '^(%d+)(.*)$')
  if not dec(sc, 0, MAX_LIMIT) or srest ~= '' and string.sub(srest, 1, 1) ~= ':' then
    return fail('WRONGTYPE', NOT_OURS .. 'window: malformed settlement', healed)
  end
  if sc ~= cost_s then
    return fail('CONFLICT', 'request id was settled with cost ' .. sc, healed)
  end
  return {1, 1, reserved, used, reset, retry(used), healed}
end

used = math.min(math.max(used + cost - reserved, 0), MAX_LIMIT)
redis.call('HSET', key, 'used', string.format('%d', used), 's:' .. id, cost_s)
return {1, 0, reserved, used, reset, retry(used), healed}
