-- One decision on one token bucket (GCRA). See doc.go for the hash layout.
--
-- KEYS[1]  bucket hash
-- ARGV[1]  rate           canonical decimal, 1..MAX_LIMIT: tokens per period
-- ARGV[2]  period_ms      canonical decimal, 1..MAX_WINDOW_MS
-- ARGV[3]  burst          canonical decimal, 1..MAX_LIMIT: bucket size
-- ARGV[4]  cost           canonical decimal, 1..burst
-- ARGV[5]  dedupe_ms      canonical decimal, 1..MAX_WINDOW_MS: request-id horizon
-- ARGV[6]  max_ids        canonical decimal, 1..MAX_REQUEST_IDS: cap on r:* records
-- ARGV[7]  strict         "1": a live bucket with another policy is POLICY
-- ARGV[8]  request_id     "" for none, else 1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]
--
-- Reply {allowed, replay, remaining, reset_ms, retry_after_ms, healed},
-- integers only. Error replies start with INVALID, CONFLICT, POLICY,
-- WRONGTYPE or REQUEST_IDS_FULL.
--
-- Time is Redis's own (TIME), in whole microseconds; the arithmetic is the
-- prelude's gcra, exact in integers.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and the WRONGTYPE checks of the read
-- come before any write. The first write of a path is either the PEXPIRE
-- that heals a bucket without TTL, after which the replies may be POLICY,
-- WRONGTYPE (a malformed record), CONFLICT or REQUEST_IDS_FULL, each marked
-- TTL_RESTORED; or the HSET that applies an accepted take. Forgetting old
-- records is planned with reads only (an HGET per queue entry looked at,
-- one HMGET of the records), REQUEST_IDS_FULL is decided on that plan, and
-- only then come the HSET, one HDEL of the plan and the PEXPIRE.
-- A refused take therefore forgets nothing; the next accepted one does.
--
-- Under maxmemory (noeviction) the HSET, the first write that may grow
-- memory, is refused before anything else is written, so a full Redis
-- leaves a bucket untouched (but for a restored TTL) or decides in full.

if #KEYS ~= 1 or #ARGV ~= 8 then
  return fail('INVALID', 'want 1 key and 8 arguments')
end
local key = KEYS[1]
local rate_s, period_s, burst_s, cost_s, dedupe_s, maxids_s, strict, id =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]

local policy = rate_s .. ':' .. period_s .. ':' .. burst_s

-- Every argument at once, the usual case: each number by num, then its
-- bounds in arithmetic, strict, and the request id in one match. A
-- canonical decimal in bounds has at most 16 digits, so each value is
-- exact. Any other arguments go through the checks one by one, which say
-- what is wrong; both accept exactly the same arguments.
local rate, period, burst, cost, dedupe, maxids =
  num(rate_s), num(period_s), num(burst_s), num(cost_s), num(dedupe_s), num(maxids_s)
if not (rate and period and burst and cost and dedupe and maxids and rate <= MAX_LIMIT
    and period <= MAX_WINDOW_MS and burst <= MAX_LIMIT and burst * period <= MAX_WINDOW_MS * rate
    and cost <= burst and dedupe <= MAX_WINDOW_MS and maxids <= MAX_REQUEST_IDS
    and (strict == '0' or strict == '1')
    and (id == '' or #id <= MAX_REQUEST_ID_BYTES and string.find(id, REQUEST_ID))) then
  rate = nil
end
if not rate then
  rate = dec(rate_s, 1, MAX_LIMIT)
  if not rate then
    return fail('INVALID', 'rate must be a decimal in 1..' .. MAX_LIMIT)
  end
  period = dec(period_s, 1, MAX_WINDOW_MS)
  if not period then
    return fail('INVALID', 'period_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
  end
  burst = dec(burst_s, 1, MAX_LIMIT)
  if not burst then
    return fail('INVALID', 'burst must be a decimal in 1..' .. MAX_LIMIT)
  end
  -- The refill time from empty bounds every time the bucket stores.
  if burst * period > MAX_WINDOW_MS * rate then
    return fail('INVALID', 'burst * period_ms / rate must be at most ' .. MAX_WINDOW_MS)
  end
  cost = dec(cost_s, 1, burst)
  if not cost then
    return fail('INVALID', 'cost must be a decimal in 1..burst')
  end
  dedupe = dec(dedupe_s, 1, MAX_WINDOW_MS)
  if not dedupe then
    return fail('INVALID', 'dedupe_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
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

local now, now_ms = redis_now()
local g = gcra(rate, period, burst, now)

local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy', 'ids', 'qh', 'qt', 'r:' .. id)
if f.err then
  return failed_read('token bucket', f)
end
local pttl = redis.call('PTTL', key)

local tat, rem, ids, qh, qt = now, 0, 0, 0, 0
local stored = f[3]
if pttl ~= -2 then
  tat = dec(f[1], 0, MAX_EXACT)
  rem = dec(f[2], 0, MAX_LIMIT)
  ids = dec(f[4] or '0', 0, MAX_REQUEST_IDS)
  qh = dec(f[5] or '0', 0, MAX_EXACT)
  qt = dec(f[6] or '0', 0, MAX_EXACT)
  -- The stored policy is well formed when it is this call's (the usual case).
  if not (tat and rem and ids and qh and qt and qh <= qt) or stored ~= policy
      and (type(stored) ~= 'string' or not string.find(stored, '^%d+:%d+:%d+$')) then
    return fail('WRONGTYPE', NOT_OURS .. 'token bucket: a hash with other fields')
  end
end
local stored_ids = ids
tat, rem = g.rebase(tat, rem, pttl == -2 or stored == policy)

-- The key lives until the bucket is full again, and as long as its newest
-- request-id record, whichever is later; never shorter than it already has.
local healed = 0
if pttl == -1 then
  -- Lost its TTL: give it back whatever follows, errors included.
  local ttl = g.ms_until(tat, rem)
  if ids > 0 then
    ttl = math.max(ttl, dedupe)
  end
  ttl = math.max(ttl, 1)
  redis.call('PEXPIRE', key, ttl)
  pttl, healed = ttl, 1
end

if strict == '1' and stored and stored ~= policy then
  return fail('POLICY', 'live bucket has rate:period_ms:burst ' .. stored, healed)
end

if id ~= '' and f[7] then
  local rc, rr, rx = string.match(f[7], '^(%d+):(%d+):(%d+)$')
  rx = dec(rx, 0, MAX_EXACT)
  if not rx or not dec(rr, 0, MAX_LIMIT) then
    return fail('WRONGTYPE', NOT_OURS .. 'token bucket: malformed request id record', healed)
  end
  if rx > now_ms then
    if rc ~= cost_s then
      return fail('CONFLICT', 'request id was accepted with cost ' .. rc, healed)
    end
    return {1, 1, rr + 0, g.ms_until(tat, rem), 0, healed}
  end
end

-- Accepted iff the take is due by now: TAT + span(cost) - tau <= now.
local new_u, new_r = g.add(tat, rem, g.span(cost))
local at_u, at_r = g.sub(new_u, new_r, g.tau_u, g.tau_r)
if not g.le(at_u, at_r, now, 0) then
  return {0, 0, g.tokens(tat, rem), g.ms_until(tat, rem), g.ms_until(at_u, at_r), healed}
end

-- Plan, with reads only, to forget up to three records past their horizon,
-- oldest first. A take adds at most one record, so under any traffic the
-- records stay bounded. Queue entries are "<id>:<expiry ms>"; a record
-- renewed after its entry was queued is newer than the entry and stays.
-- This take's own id is overwritten below, never forgotten.
local drop, popped, rf = nil, 0, nil
while popped < 3 and qh + popped < qt do
  local qf = 'q:' .. string.format('%d', qh + popped)
  local qid, qx = string.match(redis.call('HGET', key, qf) or '', '^(.+):(%d+)$')
  qx = dec(qx, 0, MAX_EXACT)
  if qx and qx > now_ms then
    break
  end
  drop = drop or {}
  drop[#drop + 1] = qf
  popped = popped + 1
  if qid and qid ~= id then
    rf = rf or {}
    rf[#rf + 1] = 'r:' .. qid
  end
end
if rf then
  -- A record named twice in the queue is looked at once.
  local recs = redis.call('HMGET', key, unpack(rf))
  local seen = {}
  for i = 1, #rf do
    local rec = recs[i]
    local rx = rec and dec(string.match(rec, ':(%d+)$'), 0, MAX_EXACT)
    if rec and not seen[rf[i]] and (not rx or rx <= now_ms) then
      seen[rf[i]] = true
      drop[#drop + 1] = rf[i]
      ids = math.max(ids - 1, 0)
    end
  end
end
qh = qh + popped

-- Only what changed is written: ids, qh and qt absent read as 0, so a
-- bucket that never held a request id has none of them. redis.call sends a
-- number as its exact decimal, so the counters go as numbers; text made
-- with '..' is exact only below 10^14, so the parts of a record are
-- formatted.
local remaining = g.tokens(new_u, new_r)
local reset = g.ms_until(new_u, new_r)
local ttl = reset
local fields = {'tat', new_u, 'rem', new_r}
if stored ~= policy then
  fields[5], fields[6] = 'policy', policy
end
local n = #fields
if id ~= '' then
  -- An expired record of this id is overwritten, so it is not counted again.
  if not f[7] then
    if ids >= maxids then
      return fail('REQUEST_IDS_FULL', 'bucket holds ' .. ids .. ' request ids', healed)
    end
    ids = ids + 1
  end
  local exp = string.format('%d', now_ms + dedupe)
  fields[n + 1], fields[n + 2] = 'r:' .. id, cost_s .. ':' .. string.format('%d', remaining) .. ':' .. exp
  fields[n + 3], fields[n + 4] = 'q:' .. string.format('%d', qt), id .. ':' .. exp
  fields[n + 5], fields[n + 6] = 'qt', qt + 1
  n = n + 6
  if ttl < dedupe then
    ttl = dedupe
  end
end
if ids ~= stored_ids then
  fields[n + 1], fields[n + 2] = 'ids', ids
  n = n + 2
end
if popped > 0 then
  fields[n + 1], fields[n + 2] = 'qh', qh
end
-- The HSET first (see the top): the fields it writes (this id's record, the
-- queue's new tail) are never among those dropped.
redis.call('HSET', key, unpack(fields))
if drop then
  redis.call('HDEL', key, unpack(drop))
end
if ttl < pttl then
  ttl = pttl
end
if ttl < 1 then
  ttl = 1
end
redis.call('PEXPIRE', key, ttl)
return {1, 0, remaining, reset, 0, healed}
