-- One decision on one token bucket (GCRA). See doc.go for the hash layout.
--
-- KEYS[1]  bucket hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {allowed, replay, used, remaining, reset_ms, retry_after_ms,
-- healed}, integers only (an allowed take that healed nothing leaves out
-- the last two), as every take's: remaining is whole tokens, used the burst
-- less them. Error replies start with INVALID, CONFLICT, POLICY, WRONGTYPE
-- or REQUEST_IDS_FULL.
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

--#args
local policy = rate_s .. ':' .. period_s .. ':' .. burst_s

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

--#include bucket_heal

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
    return {1, 1, burst - rr, rr + 0, g.ms_until(tat, rem), 0, healed}
  end
end

-- Accepted iff the take is due by now: TAT + span(cost) - tau <= now.
local new_u, new_r = g.add(tat, rem, g.span(cost))
local at_u, at_r = g.sub(new_u, new_r, g.tau_u, g.tau_r)
if not g.le(at_u, at_r, now, 0) then
  local tokens = g.tokens(tat, rem)
  return {0, 0, burst - tokens, tokens, g.ms_until(tat, rem), g.ms_until(at_u, at_r), healed}
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
if healed == 0 then
  return {1, 0, burst - remaining, remaining, reset}
end
return {1, 0, burst - remaining, remaining, reset, 0, healed}
