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
  return invalid('want 1 key and 4 arguments')
end
local key = KEYS[1]
local limit_s, lease_s, strict, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local limit, lease = lease_shape(limit_s, lease_s)
if not limit then
  return lease
end
if strict ~= '0' and strict ~= '1' then
  return invalid('strict must be 0 or 1')
end
if not valid_id(id) then
  return invalid_id()
end
local policy = limit_s .. ':' .. lease_s

local _, now = redis_now()

-- One read of the whole hash: it holds at most limit live leases.
local all, e = read('lease set', 'HGETALL', key)
if not all then
  return e
end
local stored, mine = nil, nil
local live, expired, first, last = 0, {}, nil, 0
for i = 1, #all, 2 do
  local k, v = all[i], all[i + 1]
  if k == 'policy' and string.match(v, '^[0-9]+:[0-9]+$') then
    stored = v
  else
    local lid = string.match(k, '^l:(.+)$')
    local x = dec(v, 0, MAX_EXACT)
    if not lid or not x then
      return not_ours('lease set', 'a hash with other fields')
    end
    if x <= now then
      table.insert(expired, k)
    elseif lid == id then
      mine = x
    else
      live = live + 1
      first = math.min(first or x, x)
      last = math.max(last, x)
    end
  end
end
if #all > 0 and not stored then
  return not_ours('lease set', 'a hash with other fields')
end

local pttl = redis.call('PTTL', key)
local healed = 0
if pttl == -1 then
  -- Lost its TTL: give it back whatever follows, errors included.
  redis.call('PEXPIRE', key, math.max(last - now, (mine or 0) - now, 1))
  healed = 1
end
if strict == '1' and stored and stored ~= policy then
  return refuse(healed, 'POLICY live lease set has limit:lease_ms ' .. stored)
end

-- Reclaim what expired, whatever the decision.
if #expired > 0 then
  redis.call('HDEL', key, unpack(expired))
end
-- A renewal keeps its slot even when a lowered limit is now full.
if not mine and live >= limit then
  redis.call('PEXPIRE', key, last - now)
  return {0, 0, live, last - now, first - now, healed}
end
local exp = now + lease
redis.call('HSET', key, 'l:' .. id, string.format('%d', exp), 'policy', policy)
last = math.max(last, exp)
redis.call('PEXPIRE', key, last - now)
local replay = 0
if mine then
  replay = 1
end
return {1, replay, live + 1, last - now, 0, healed}
