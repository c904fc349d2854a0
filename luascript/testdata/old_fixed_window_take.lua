-- One quota decision on one fixed window. See doc.go for the hash layout.
--
-- KEYS[1]  window hash
-- ARGV[1]  limit          canonical decimal, 1..1000000000
-- ARGV[2]  window_ms      canonical decimal, 1..2678400000 (31 days)
-- ARGV[3]  cost           canonical decimal, 1..limit
-- ARGV[4]  max_ids        canonical decimal, 1..1000000: cap on r:* records
-- ARGV[5]  strict         "1": a live window with another policy is POLICY
-- ARGV[6]  request_id     "" for none, else 1..64 of [A-Za-z0-9_-]
--
-- Reply {allowed, used, replay, pttl_ms, healed}, integers only. Error replies
-- start with INVALID, CONFLICT, POLICY, WRONGTYPE or REQUEST_IDS_FULL.
--
-- Redis calls per decision: one HMGET, one PTTL, at most one HSET, and a
-- PEXPIRE only when the window is created or has lost its TTL.
--
-- Every argument is checked before Redis is touched. The only write that may
-- precede an error reply or a denial is restoring a missing TTL, and no path
-- leaves the key without one.
--
-- Under maxmemory (noeviction) Redis refuses only a script's first write
-- that may grow memory (HSET), and allows every write after one succeeded.
-- Each path's first write is its HSET, or a PEXPIRE (never refused) that
-- restores a TTL, so a full Redis leaves a window untouched or decides in
-- full: nothing is ever half-written. Keep that order when changing a path.

if #KEYS ~= 1 or #ARGV ~= 6 then
  return redis.error_reply('INVALID want 1 key and 6 arguments')
end
local key = KEYS[1]
local limit_s, window_s, cost_s, maxids_s, strict, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]

-- A canonical decimal in lo..hi, else nil. The pattern refuses what tonumber
-- would take ("0x1", " 1", "1e0", "-1", "1.5"); at most 10 digits keeps the
-- value exact in a double.
local function dec(s, lo, hi)
  if type(s) ~= 'string' or #s > 10 or not (s == '0' or string.match(s, '^[1-9][0-9]*$')) then
    return nil
  end
  local n = tonumber(s)
  if n < lo or n > hi then
    return nil
  end
  return n
end

local limit = dec(limit_s, 1, 1000000000)
if not limit then
  return redis.error_reply('INVALID limit must be a decimal in 1..1000000000')
end
local window = dec(window_s, 1, 2678400000)
if not window then
  return redis.error_reply('INVALID window_ms must be a decimal in 1..2678400000')
end
local cost = dec(cost_s, 1, limit)
if not cost then
  return redis.error_reply('INVALID cost must be a decimal in 1..limit')
end
local maxids = dec(maxids_s, 1, 1000000)
if not maxids then
  return redis.error_reply('INVALID max request ids must be a decimal in 1..1000000')
end
if strict ~= '0' and strict ~= '1' then
  return redis.error_reply('INVALID strict must be 0 or 1')
end
if id ~= '' and (#id > 64 or not string.match(id, '^[A-Za-z0-9_%-]+$')) then
  return redis.error_reply('INVALID request id must be 1..64 of A-Z a-z 0-9 _ -')
end

local policy = limit_s .. ':' .. window_s

-- pcall rather than a TYPE call: a key of another type fails this one read.
-- errors.go recognises our WRONGTYPE replies by 'key is not a quotad window'.
local f = redis.pcall('HMGET', key, 'used', 'policy', 'ids', 'r:' .. id)
if f.err then
  if string.sub(f.err, 1, 10) == 'WRONGTYPE ' then
    return redis.error_reply('WRONGTYPE key is not a quotad window: it holds another type')
  end
  return f
end
local pttl = redis.call('PTTL', key)

if pttl == -2 then
  -- No window. cost <= limit and max_ids >= 1, so the first take is always
  -- accepted; the window opens now and its end never moves afterwards.
  if id == '' then
    redis.call('HSET', key, 'used', cost_s, 'policy', policy, 'ids', '0')
  else
    redis.call('HSET', key, 'used', cost_s, 'policy', policy, 'ids', '1', 'r:' .. id, cost_s .. ':' .. cost_s)
  end
  redis.call('PEXPIRE', key, window_s)
  return {1, cost, 0, window, 0}
end

local used = dec(f[1], 0, 1000000000)
-- ids absent counts as 0 so a window written without it stays usable.
local ids = dec(f[3] or '0', 0, 1000000)
if not used or not ids or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[0-9]+$') then
  return redis.error_reply('WRONGTYPE key is not a quotad window: a hash with other fields')
end

-- A window without a TTL would hold its quota forever, so it gets one on
-- whatever path follows, errors included.
local healed = 0
if pttl == -1 then
  -- The window's own length when it is sane, not this caller's: a caller
  -- refused for other limits must not decide how long the window lives.
  local own = dec(string.match(f[2], ':([0-9]+)$'), 1, 2678400000) or window
  redis.call('PEXPIRE', key, own)
  pttl, healed = own, 1
end

-- An error reply after healing says so, so that the caller can log and
-- count the repair whatever the answer.
local function refuse(msg)
  if healed == 1 then
    msg = msg .. ' ' .. 'TTL_RESTORED'
  end
  return redis.error_reply(msg)
end

if strict == '1' and f[2] ~= policy then
  return refuse('POLICY live window has limit:window_ms ' .. f[2])
end

if id ~= '' and f[4] then
  local rc, ru = string.match(f[4], '^([0-9]+):([0-9]+)$')
  ru = dec(ru, 1, 1000000000)
  if not ru then
    return refuse('WRONGTYPE key is not a quotad window: malformed request id record')
  end
  if rc ~= cost_s then
    return refuse('CONFLICT request id was accepted with cost ' .. rc)
  end
  return {1, ru, 1, pttl, healed}
end

-- A named policy's new limit applies at once against the recorded use.
if used + cost > limit then
  return {0, used, 0, pttl, healed}
end

-- Sums stay below 2^31, which tostring's 14 significant digits print exactly.
used = used + cost
if id == '' then
  redis.call('HSET', key, 'used', used, 'policy', policy)
else
  if ids >= maxids then
    return refuse('REQUEST_IDS_FULL window holds ' .. ids .. ' request ids')
  end
  redis.call('HSET', key, 'used', used, 'policy', policy, 'ids', ids + 1, 'r:' .. id, cost_s .. ':' .. used)
end
return {1, used, 0, pttl, healed}
