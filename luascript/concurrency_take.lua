-- Acquires or renews one concurrency lease. See doc.go for the hash layout.
--
-- KEYS[1]  lease hash
-- ARGV[1]  limit          canonical decimal, 1..MAX_LEASES: leases held at once
-- ARGV[2]  lease_ms       canonical decimal, 1..MAX_WINDOW_MS
-- ARGV[3]  strict         "1": a live hash with another policy is POLICY
-- ARGV[4]  request_id     1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]: the lease's name
--
-- Reply {allowed, replay, used, reset_ms, retry_after_ms, healed}, integers
-- only: used counts live leases after the decision, reset_ms is until the
-- last of them expires, retry_after_ms until the first does (when denied).
-- Error replies start with INVALID, POLICY or WRONGTYPE.
--
-- Time is Redis's own (TIME), in milliseconds. Expired leases are reclaimed
-- here, so a holder that died blocks the subject for at most its lease.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and every WRONGTYPE check of the one
-- read comes before any write. The first write is either the PEXPIRE that
-- heals a set without TTL, after which the only error is POLICY, marked
-- TTL_RESTORED; or, past the POLICY check, the HDEL that reclaims expired
-- leases, after which every path answers a decision.

if #KEYS ~= 1 or #ARGV ~= 4 then
  return fail('INVALID', 'want 1 key and 4 arguments')
end
local key = KEYS[1]
local limit_s, lease_s, strict, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local policy = limit_s .. ':' .. lease_s

-- Every argument at once, the usual case: each number by num, then its
-- bounds in arithmetic, strict, and the request id in one match. A
-- canonical decimal in bounds has at most 16 digits, so each value is
-- exact. Any other arguments go through the checks one by one, which say
-- what is wrong; both accept exactly the same arguments.
local limit, lease = num(limit_s), num(lease_s)
if not (limit and lease and limit <= MAX_LEASES and lease <= MAX_WINDOW_MS and (strict == '0' or strict == '1')
    and #id <= MAX_REQUEST_ID_BYTES and string.find(id, REQUEST_ID)) then
  limit = nil
end
if not limit then
  limit = dec(limit_s, 1, MAX_LEASES)
  if not limit then
    return fail('INVALID', 'limit must be a decimal in 1..' .. MAX_LEASES)
  end
  lease = dec(lease_s, 1, MAX_WINDOW_MS)
  if not lease then
    return fail('INVALID', 'lease_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
  end
  if strict ~= '0' and strict ~= '1' then
    return fail('INVALID', 'strict must be 0 or 1')
  end
  if #id < 1 or #id > MAX_REQUEST_ID_BYTES or not string.find(id, REQUEST_ID) then
    return fail('INVALID', REQUEST_ID_RULE)
  end
end

local _, now = redis_now()

-- One read of the whole hash: it holds at most limit live leases. Each
-- field is checked with one match of its name and dec of its value, and
-- compared with plain operators: no capture, no math call.
local all = redis.pcall('HGETALL', key)
if all.err then
  return failed_read('lease set', all)
end
local own = 'l:' .. id
local stored, mine = nil, nil
local live, expired, first, last = 0, nil, nil, 0
for i = 1, #all, 2 do
  local k, v = all[i], all[i + 1]
  if k == 'policy' and (v == policy or string.find(v, '^%d+:%d+$')) then
    stored = v
  else
    local x = dec(v, 0, MAX_EXACT)
    if not x or not string.find(k, '^l:.') then
      return fail('WRONGTYPE', NOT_OURS .. 'lease set: a hash with other fields')
    end
    if x <= now then
      expired = expired or {}
      expired[#expired + 1] = k
    elseif k == own then
      mine = x
    else
      live = live + 1
      if not first or x < first then
        first = x
      end
      if x > last then
        last = x
      end
    end
  end
end
local healed = 0
if #all > 0 then
  if not stored then
    return fail('WRONGTYPE', NOT_OURS .. 'lease set: a hash with other fields')
  end
  -- A key that HGETALL found empty does not exist: it has no TTL to lose.
  if redis.call('PTTL', key) == -1 then
    -- Lost its TTL: give it back whatever follows, errors included.
    redis.call('PEXPIRE', key, math.max(last - now, (mine or 0) - now, 1))
    healed = 1
  end
end
if strict == '1' and stored and stored ~= policy then
  return fail('POLICY', 'live lease set has limit:lease_ms ' .. stored, healed)
end

-- Reclaim what expired, whatever the decision.
if expired then
  redis.call('HDEL', key, unpack(expired))
end
-- A renewal keeps its slot even when a lowered limit is now full.
if not mine and live >= limit then
  redis.call('PEXPIRE', key, last - now)
  return {0, 0, live, last - now, first - now, healed}
end
local exp = now + lease
if stored == policy then
  redis.call('HSET', key, own, string.format('%d', exp))
else
  redis.call('HSET', key, own, string.format('%d', exp), 'policy', policy)
end
if exp > last then
  last = exp
end
redis.call('PEXPIRE', key, last - now)
local replay = 0
if mine then
  replay = 1
end
return {1, replay, live + 1, last - now, 0, healed}
