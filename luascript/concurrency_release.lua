-- Frees one concurrency lease. See doc.go for the hash layout.
--
-- KEYS[1]  lease hash
-- ARGV[1]  request_id     1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]: the lease's name
--
-- Reply {released, used}, integers only: released is 1 when a live lease of
-- that name was freed, 0 when there was none (expired, released before, or
-- never taken); used counts the live leases left. Expired leases are
-- reclaimed; a set left with no lease is deleted, else its TTL is that of
-- its last lease.
--
-- No error reply follows a write. Every argument is checked before Redis
-- is touched, and every WRONGTYPE check of the one read comes before the
-- first write (DEL, or HDEL then PEXPIRE), after which only the decision
-- is answered.

if #KEYS ~= 1 or #ARGV ~= 1 then
  return fail('INVALID', 'want 1 key and 1 argument')
end
local key, id = KEYS[1], ARGV[1]
if #id < 1 or #id > MAX_REQUEST_ID_BYTES or not string.find(id, REQUEST_ID) then
  return fail('INVALID', REQUEST_ID_RULE)
end

local _, now = redis_now()

local all = redis.pcall('HGETALL', key)
if all.err then
  return failed_read('lease set', all)
end
if #all == 0 then
  return {0, 0}
end
local mine = 'l:' .. id
local stored, released, live, last, gone = false, 0, 0, 0, nil
for i = 1, #all, 2 do
  local k, v = all[i], all[i + 1]
  if k == 'policy' and string.find(v, '^%d+:%d+$') then
    stored = true
  else
    local x = dec(v, 0, MAX_EXACT)
    if not string.find(k, '^l:.') or not x then
      return fail('WRONGTYPE', NOT_OURS .. 'lease set: a hash with other fields')
    end
    if x <= now then
      gone = gone or {}
      gone[#gone + 1] = k
    elseif k == mine then
      gone = gone or {}
      gone[#gone + 1] = k
      released = 1
    else
      live = live + 1
      if x > last then
        last = x
      end
    end
  end
end
if not stored then
  return fail('WRONGTYPE', NOT_OURS .. 'lease set: a hash with other fields')
end
if live == 0 then
  redis.call('DEL', key)
  return {released, 0}
end
if gone then
  redis.call('HDEL', key, unpack(gone))
end
redis.call('PEXPIRE', key, last - now)
return {released, live}
