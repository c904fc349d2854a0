-- Acquires or renews one concurrency lease. See doc.go for the hash layout.
--
-- KEYS[1]  lease hash
-- ARGV[1]  limit          canonical decimal, 1..100000: leases held at once
-- ARGV[2]  lease_ms       canonical decimal, 1..2678400000
-- ARGV[3]  strict         "1": a live hash with another policy is POLICY
-- ARGV[4]  request_id     1..64 of [A-Za-z0-9_-]: the lease's name
--
-- Reply {allowed, replay, used, reset_ms, retry_after_ms, healed}, integers
-- only: used counts live leases after the decision, reset_ms is until the
-- last of them expires, retry_after_ms until the first does (when denied).
-- Error replies start with INVALID, POLICY or WRONGTYPE.
--
-- Time is Redis's own (TIME), in milliseconds. Expired leases are reclaimed
-- here, so a holder that died blocks the subject for at most its lease.

if #KEYS ~= 1 or #ARGV ~= 4 then
  return redis.error_reply('INVALID want 1 key and 4 arguments')
end
local key = KEYS[1]
local limit_s, lease_s, strict, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local function dec(s, lo, hi)
  if type(s) ~= 'string' or #s > 16 or not (s == '0' or string.match(s, '^[1-9][0-9]*$')) then
    return nil
  end
  local n = tonumber(s)
  if n < lo or n > hi then
    return nil
  end
  return n
end

local limit = dec(limit_s, 1, 100000)
if not limit then
  return redis.error_reply('INVALID limit must be a decimal in 1..100000')
end
local lease = dec(lease_s, 1, 2678400000)
if not lease then
  return redis.error_reply('INVALID lease_ms must be a decimal in 1..2678400000')
end
if strict ~= '0' and strict ~= '1' then
  return redis.error_reply('INVALID strict must be 0 or 1')
end
if #id < 1 or #id > 64 or not string.match(id, '^[A-Za-z0-9_%-]+$') then
  return redis.error_reply('INVALID request id must be 1..64 of A-Z a-z 0-9 _ -')
end
local policy = limit_s .. ':' .. lease_s

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- One read of the whole hash: it holds at most limit live leases.
local all = redis.pcall('HGETALL', key)
if all.err then
  if string.sub(all.err, 1, 10) == 'WRONGTYPE ' then
    return redis.error_reply('WRONGTYPE key is not a quotad lease set: it holds another type')
  end
  return all
end
local stored, mine = nil, nil
local live, expired, first, last = 0, {}, nil, 0
for i = 1, #all, 2 do
  local k, v = all[i], all[i + 1]
  if k == 'policy' and string.match(v, '^[0-9]+:[0-9]+$') then
    stored = v
  else
    local lid = string.match(k, '^l:(.+)$')
    local x = dec(v, 0, 9007199254740991)
    if not lid or not x then
      return redis.error_reply('WRONGTYPE key is not a quotad lease set: a hash with other fields')
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
  return redis.error_reply('WRONGTYPE key is not a quotad lease set: a hash with other fields')
end

local pttl = redis.call('PTTL', key)
local healed = 0
if pttl == -1 then
  -- Lost its TTL: give it back whatever follows, errors included.
  redis.call('PEXPIRE', key, math.max(last - now, (mine or 0) - now, 1))
  healed = 1
end
if strict == '1' and stored and stored ~= policy then
  local msg = 'POLICY live lease set has limit:lease_ms ' .. stored
  if healed == 1 then
    msg = msg .. ' TTL_RESTORED'
  end
  return redis.error_reply(msg)
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
