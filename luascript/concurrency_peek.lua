#!lua flags=no-writes
-- Reads one lease set without writing anything; expired leases are not
-- counted (the next take or release reclaims them). The flags line lets
-- Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  lease hash
-- ARGV[1]  limit          canonical decimal, 1..MAX_LEASES
-- ARGV[2]  lease_ms       canonical decimal, 1..MAX_WINDOW_MS
-- ARGV[3]  strict         "1": a live hash with another policy is POLICY
--
-- Reply {used, reset_ms}, integers only: live leases, and milliseconds until
-- the last of them expires (0 when none is held).
--
-- It never writes, so no error reply follows a write; Redis refuses any
-- write it tried (no-writes).

if #KEYS ~= 1 or #ARGV ~= 3 then
  return fail('INVALID', 'want 1 key and 3 arguments')
end
local key = KEYS[1]
local limit_s, lease_s, strict = ARGV[1], ARGV[2], ARGV[3]

if not dec(limit_s, 1, MAX_LEASES) then
  return fail('INVALID', 'limit must be a decimal in 1..' .. MAX_LEASES)
end
if not dec(lease_s, 1, MAX_WINDOW_MS) then
  return fail('INVALID', 'lease_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
end
if strict ~= '0' and strict ~= '1' then
  return fail('INVALID', 'strict must be 0 or 1')
end

local policy = limit_s .. ':' .. lease_s
local _, now = redis_now()

local all = redis.pcall('HGETALL', key)
if all.err then
  return failed_read('lease set', all)
end
local stored, live, last = nil, 0, 0
for i = 1, #all, 2 do
  local k, v = all[i], all[i + 1]
  if k == 'policy' and (v == policy or string.find(v, '^%d+:%d+$')) then
    stored = v
  else
    local x = dec(v, 0, MAX_EXACT)
    if not string.find(k, '^l:.') or not x then
      return fail('WRONGTYPE', NOT_OURS .. 'lease set: a hash with other fields')
    end
    if x > now then
      live = live + 1
      if x > last then
        last = x
      end
    end
  end
end
if #all > 0 and not stored then
  return fail('WRONGTYPE', NOT_OURS .. 'lease set: a hash with other fields')
end
if strict == '1' and stored and stored ~= policy then
  return fail('POLICY', 'live lease set has limit:lease_ms ' .. stored)
end
if live == 0 then
  return {0, 0}
end
return {live, last - now}
