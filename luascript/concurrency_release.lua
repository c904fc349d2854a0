-- Frees one concurrency lease. See doc.go for the hash layout.
--
-- KEYS[1]  lease hash
-- ARGV[1]  request_id     1..64 of [A-Za-z0-9_-]: the lease's name
--
-- Reply {released, used}, integers only: released is 1 when a live lease of
-- that name was freed, 0 when there was none (expired, released before, or
-- never taken); used counts the live leases left. Expired leases are
-- reclaimed; a set left with no lease is deleted, else its TTL is that of
-- its last lease.

if #KEYS ~= 1 or #ARGV ~= 1 then
  return redis.error_reply('INVALID want 1 key and 1 argument')
end
local key, id = KEYS[1], ARGV[1]
if #id < 1 or #id > 64 or not string.match(id, '^[A-Za-z0-9_%-]+$') then
  return redis.error_reply('INVALID request id must be 1..64 of A-Z a-z 0-9 _ -')
end

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

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local all = redis.pcall('HGETALL', key)
if all.err then
  if string.sub(all.err, 1, 10) == 'WRONGTYPE ' then
    return redis.error_reply('WRONGTYPE key is not a quotad lease set: it holds another type')
  end
  return all
end
if #all == 0 then
  return {0, 0}
end
local stored, released, live, last, gone = false, 0, 0, 0, {}
for i = 1, #all, 2 do
  local k, v = all[i], all[i + 1]
  if k == 'policy' and string.match(v, '^[0-9]+:[0-9]+$') then
    stored = true
  else
    local x = dec(v, 0, 9007199254740991)
    if not string.match(k, '^l:.') or not x then
      return redis.error_reply('WRONGTYPE key is not a quotad lease set: a hash with other fields')
    end
    if x <= now then
      table.insert(gone, k)
    elseif k == 'l:' .. id then
      table.insert(gone, k)
      released = 1
    else
      live = live + 1
      last = math.max(last, x)
    end
  end
end
if not stored then
  return redis.error_reply('WRONGTYPE key is not a quotad lease set: a hash with other fields')
end
if live == 0 then
  redis.call('DEL', key)
  return {released, 0}
end
if #gone > 0 then
  redis.call('HDEL', key, unpack(gone))
end
redis.call('PEXPIRE', key, last - now)
return {released, live}
