-- One quota decision on one fixed window. See doc.go for the hash layout.
--
-- KEYS[1]  window hash
-- ARGV[1]  limit          canonical decimal, 1..MAX_LIMIT
-- ARGV[2]  window_ms      canonical decimal, 1..MAX_WINDOW_MS (31 days)
-- ARGV[3]  cost           canonical decimal, 1..limit
-- ARGV[4]  max_ids        canonical decimal, 1..MAX_REQUEST_IDS: cap on r:* records
-- ARGV[5]  strict         "1": a live window with another policy is POLICY
-- ARGV[6]  request_id     "" for none, else 1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]
--
-- Reply {allowed, used, replay, pttl_ms, healed}, integers only. Error replies
-- start with INVALID, CONFLICT, POLICY, WRONGTYPE or REQUEST_IDS_FULL.
--
-- Redis calls per decision: one HMGET, one PTTL, at most one HSET, and a
-- PEXPIRE only when the window is created or has lost its TTL.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and the WRONGTYPE checks of the read
-- come before any write. The first write of a path is either the PEXPIRE
-- that heals a window without TTL, after which the replies may be POLICY,
-- WRONGTYPE (a malformed record), CONFLICT or REQUEST_IDS_FULL, each marked
-- TTL_RESTORED; or the HSET that applies an accepted take, after which only
-- the PEXPIRE of a new window and the decision follow. REQUEST_IDS_FULL is
-- decided before that HSET.
--
-- Under maxmemory (noeviction) Redis refuses only a script's first write
-- that may grow memory (HSET), and allows every write after one succeeded.
-- Each path's first write is its HSET, or a PEXPIRE (never refused) that
-- restores a TTL, so a full Redis leaves a window untouched or decides in
-- full: nothing is ever half-written. Keep that order when changing a path.

if #KEYS ~= 1 or #ARGV ~= 6 then
  return fail('INVALID', 'want 1 key and 6 arguments')
end
local key = KEYS[1]
local limit_s, window_s, cost_s, maxids_s, strict, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local policy = limit_s .. ':' .. window_s

-- Every argument at once, the usual case: each number by num, then its
-- bounds in arithmetic, strict, and the request id in one match. A
-- canonical decimal in bounds has at most 16 digits, so each value is
-- exact. Any other arguments go through the checks one by one, which say
-- what is wrong; both accept exactly the same arguments.
local limit, window, cost, maxids = num(limit_s), num(window_s), num(cost_s), num(maxids_s)
if not (limit and window and cost and maxids and limit <= MAX_LIMIT and window <= MAX_WINDOW_MS
    and cost <= limit and maxids <= MAX_REQUEST_IDS and (strict == '0' or strict == '1')
    and (id == '' or #id <= MAX_REQUEST_ID_BYTES and string.find(id, REQUEST_ID))) then
  limit = nil
end
if not limit then
  limit = dec(limit_s, 1, MAX_LIMIT)
  if not limit then
    return fail('INVALID', 'limit must be a decimal in 1..' .. MAX_LIMIT)
  end
  window = dec(window_s, 1, MAX_WINDOW_MS)
  if not window then
    return fail('INVALID', 'window_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
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

local f = redis.pcall('HMGET', key, 'used', 'policy', 'ids', 'r:' .. id)
if f.err then
  return failed_read('window', f)
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

local used = dec(f[1], 0, MAX_LIMIT)
-- ids absent counts as 0 so a window written without it stays usable.
local ids = dec(f[3] or '0', 0, MAX_REQUEST_IDS)
-- The stored policy is well formed when it is this call's (the usual case).
if not used or not ids or f[2] ~= policy and (type(f[2]) ~= 'string' or not string.find(f[2], '^%d+:%d+$')) then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end

-- A window without a TTL would hold its quota forever, so it gets one on
-- whatever path follows, errors included.
local healed = 0
if pttl == -1 then
  -- The window's own length when it is sane, not this caller's: a caller
  -- refused for other limits must not decide how long the window lives.
  local own = dec(string.match(f[2], ':(%d+)$'), 1, MAX_WINDOW_MS) or window
  redis.call('PEXPIRE', key, own)
  pttl, healed = own, 1
end

if strict == '1' and f[2] ~= policy then
  return fail('POLICY', 'live window has limit:window_ms ' .. f[2], healed)
end

if id ~= '' and f[4] then
  local rc, ru = string.match(f[4], '^(%d+):(%d+)$')
  ru = dec(ru, 1, MAX_LIMIT)
  if not ru then
    return fail('WRONGTYPE', NOT_OURS .. 'window: malformed request id record', healed)
  end
  if rc ~= cost_s then
    return fail('CONFLICT', 'request id was accepted with cost ' .. rc, healed)
  end
  return {1, ru, 1, pttl, healed}
end

-- A named policy's new limit applies at once against the recorded use.
if used + cost > limit then
  return {0, used, 0, pttl, healed}
end

if id ~= '' and ids >= maxids then
  return fail('REQUEST_IDS_FULL', 'window holds ' .. ids .. ' request ids', healed)
end

-- Sums stay below 2^31, which tostring's 14 significant digits print
-- exactly. The policy is written only when it changed.
used = used + cost
if id == '' then
  if f[2] == policy then
    redis.call('HSET', key, 'used', used)
  else
    redis.call('HSET', key, 'used', used, 'policy', policy)
  end
elseif f[2] == policy then
  redis.call('HSET', key, 'used', used, 'ids', ids + 1, 'r:' .. id, cost_s .. ':' .. used)
else
  redis.call('HSET', key, 'used', used, 'policy', policy, 'ids', ids + 1, 'r:' .. id, cost_s .. ':' .. used)
end
return {1, used, 0, pttl, healed}
