-- The quota script of the design documents, unchanged: make bench runs it
-- from an in-process rueidis client as the baseline quotad is compared with.
-- KEYS[1] hash; ARGV request_id, cost, limit (<= 10000), window_ms.
-- One short-lived hash per subject. Validation precedes every write.
local cost, limit, window = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not cost or not limit or not window or cost % 1 ~= 0 or limit % 1 ~= 0 or window % 1 ~= 0
  or cost < 1 or limit < 1 or limit > 10000 or cost > limit or window < 1 or window > 86400000 then
  return redis.error_reply('INVALID integer cost/limit/window')
end
if not string.match(ARGV[1], '^[%w_-]+$') or string.len(ARGV[1]) > 64 then
  return redis.error_reply('INVALID request id')
end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' and kind ~= 'hash' then return redis.error_reply('WRONGTYPE quota requires hash') end
local policy = tostring(limit) .. ':' .. tostring(window)
local oldpolicy = redis.call('HGET', KEYS[1], 'policy')
if oldpolicy and oldpolicy ~= policy then return redis.error_reply('POLICY changed within window') end
local field = 'request:' .. ARGV[1]
local previous = redis.call('HGET', KEYS[1], field)
if previous then
  local oldcost, used = string.match(previous, '^(%d+):(%d+)$')
  if tonumber(oldcost) ~= cost then return redis.error_reply('CONFLICT request cost changed') end
  return {1, tonumber(used), 1}
end
local used = tonumber(redis.call('HGET', KEYS[1], 'used') or '0')
if used + cost > limit then return {0, used, 0} end
used = used + cost
redis.call('HSET', KEYS[1], 'policy', policy, 'used', used, field, tostring(cost) .. ':' .. tostring(used))
if not oldpolicy then redis.call('PEXPIRE', KEYS[1], window) end
return {1, used, 0}
