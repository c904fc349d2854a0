#!lua flags=no-writes
-- Reads one lease set without writing anything; expired leases are not
-- counted (the next take or release reclaims them). The flags line lets
-- Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  lease hash
-- ARGV[1]  limit          canonical decimal, 1..100000
-- ARGV[2]  lease_ms       canonical decimal, 1..2678400000
-- ARGV[3]  strict         "1": a live hash with another policy is POLICY
--
-- Reply {used, reset_ms}, integers only: live leases, and milliseconds until
-- the last of them expires (0 when none is held).

if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply('INVALID want 1 key and 3 arguments')
end
local key = KEYS[1]
local limit_s, lease_s, strict = ARGV[1], ARGV[2], ARGV[3]

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

if not dec(limit_s, 1, 100000) then
  return redis.error_reply('INVALID limit must be a decimal in 1..100000')
end
if not dec(lease_s, 1, 2678400000) then
  return redis.error_reply('INVALID lease_ms must be a decimal in 1..2678400000')
end
if strict ~= '0' and strict ~= '1' then
  return redis.error_reply('INVALID strict must be 0 or 1')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local all = redis.pcall('HGETALL', key)
if all.err then
  if string.sub(all.err, 1, 10) == 'WRONGTYPE ' then
    return redis.error_reply('WRONGTYPE key is not a quotad lease set: it holds another type')
  end
  return all
end
local stored, live, last = nil, 0, 0
for i = 1, #all, 2 do
  local k, v = all[i], all[i + 1]
  if k == 'policy' and string.match(v, '^[0-9]+:[0-9]+$') then
    stored = v
  else
    local x = dec(v, 0, 9007199254740991)
    if not string.match(k, '^l:.') or not x then
      return redis.error_reply('WRONGTYPE key is not a quotad lease set: a hash with other fields')
    end
    if x > now then
      live = live + 1
      last = math.max(last, x)
    end
  end
end
if #all > 0 and not stored then
  return redis.error_reply('WRONGTYPE key is not a quotad lease set: a hash with other fields')
end
if strict == '1' and stored and stored ~= limit_s .. ':' .. lease_s then
  return redis.error_reply('POLICY live lease set has limit:lease_ms ' .. stored)
end
if live == 0 then
  return {0, 0}
end
return {live, last - now}
