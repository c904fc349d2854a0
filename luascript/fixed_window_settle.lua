-- Settles an accepted take of one fixed window: the take reserved the cost
-- its record holds, and the work it paid for cost this much. See doc.go for
-- the hash layout.
--
-- KEYS[1]  window hash
-- ARGV[1]  limit          canonical decimal, 1..MAX_LIMIT
-- ARGV[2]  window_ms      canonical decimal, 1..MAX_WINDOW_MS
-- ARGV[3]  cost           canonical decimal, 0..MAX_LIMIT: the take's actual cost
-- ARGV[4]  strict         "1": a live window with another policy is POLICY
-- ARGV[5]  request_id     1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]: the take's
--
-- Reply {settled, replay, reserved, used, reset_ms, retry_after_ms, healed},
-- integers only. settled 0: the window holds no take of that request id
-- (the window ended, or the id was never accepted in it), nothing changed,
-- and used and reset_ms are the window's as they are. replay 1: this
-- request id was settled before with this cost, nothing changed. Otherwise
-- used moves by cost - reserved and s:<id> records the cost. retry_after_ms
-- is what a take of 1 would be told now. Error replies start with INVALID,
-- CONFLICT (settled before with another cost), POLICY or WRONGTYPE.
--
-- A settle is never limited: used may end above the limit (takes then wait
-- for the window's end), and saturates at MAX_LIMIT, the bound every script
-- reads used with. It never creates a window and never moves its end: the
-- only PEXPIRE is the one that heals a window without TTL.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and the WRONGTYPE checks of the read
-- come before any write. The first write of a path is either the PEXPIRE
-- that heals a window without TTL, after which the replies may be POLICY,
-- WRONGTYPE (a malformed record or settlement) or CONFLICT, each marked
-- TTL_RESTORED; or the one HSET that applies the settlement (used and
-- s:<id> together), after which only the reply follows.
--
-- Under maxmemory (noeviction) Redis refuses the HSET, the only write that
-- may grow memory, before anything else is written: a full Redis leaves
-- the window as it was (but for a restored TTL) or settles in full.
--
-- Records are read as "<cost>:<used>" followed by nothing or by ':' and
-- fields this script does not know, which it leaves as they are; it never
-- rewrites a take's record.

if #KEYS ~= 1 or #ARGV ~= 5 then
  return fail('INVALID', 'want 1 key and 5 arguments')
end
local key = KEYS[1]
local limit_s, window_s, cost_s, strict, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local limit = dec(limit_s, 1, MAX_LIMIT)
if not limit then
  return fail('INVALID', 'limit must be a decimal in 1..' .. MAX_LIMIT)
end
local window = dec(window_s, 1, MAX_WINDOW_MS)
if not window then
  return fail('INVALID', 'window_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
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
local policy = limit_s .. ':' .. window_s

local f = redis.pcall('HMGET', key, 'used', 'policy', 'r:' .. id, 's:' .. id)
if f.err then
  return failed_read('window', f)
end
local pttl = redis.call('PTTL', key)
if pttl == -2 then
  return {0, 0, 0, 0, 0, 0, 0}
end

local used = dec(f[1], 0, MAX_LIMIT)
if not used or f[2] ~= policy and (type(f[2]) ~= 'string' or not string.find(f[2], '^%d+:%d+$')) then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end

local healed = 0
if pttl == -1 then
  -- The window's own length, as the take gives it.
  local own = dec(string.match(f[2], ':(%d+)$'), 1, MAX_WINDOW_MS) or window
  redis.call('PEXPIRE', key, own)
  pttl, healed = own, 1
end

if strict == '1' and f[2] ~= policy then
  return fail('POLICY', 'live window has limit:window_ms ' .. f[2], healed)
end

-- What a take of 1 would be told: a window frees capacity when it ends.
local function retry(u)
  if u >= limit then
    return pttl
  end
  return 0
end

if not f[3] then
  return {0, 0, 0, used, pttl, retry(used), healed}
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
  return {1, 1, reserved, used, pttl, retry(used), healed}
end

-- used holds this take's reservation, so it stays at least cost; the
-- bounds are kept whatever another writer left.
used = math.min(math.max(used + cost - reserved, 0), MAX_LIMIT)
redis.call('HSET', key, 'used', string.format('%d', used), 's:' .. id, cost_s)
return {1, 0, reserved, used, pttl, retry(used), healed}
