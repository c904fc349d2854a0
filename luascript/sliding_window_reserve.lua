-- A reservation on one sliding window (docs/allotments.md): a take of
-- between cost and want units now, counted in the current period as
-- sliding_window_take.lua counts one, recorded under its holder with that
-- period's start so that what it gives back later goes to the period it
-- counted in, once (sliding_window_return.lua). See doc.go for the hash
-- layout.
--
-- KEYS[1]  sliding window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {granted, used, remaining, reset_ms, retry_after_ms, valid_ms,
-- healed, period}, as every reservation's (ParseReserve): granted 0 is a
-- denial of the take's cost; valid_ms is until the current period ends,
-- as long as the units may be handed out, so that each counts in the
-- period it is handed out in, as a take then would. period is 0. Error
-- replies start with INVALID or WRONGTYPE.
--
-- No error reply follows a write other than a restored TTL, and the one
-- HSET that applies the reservation is the first write that may grow
-- memory; only its PEXPIRE follows.

--#args
local policy = limit_s .. ':' .. window_s
local field = 'a:' .. id

local _, now = redis_now()

local f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy', field)
if f.err then
  return failed_read('sliding window', f)
end
local pttl = redis.call('PTTL', key)

local s, c, p, stored = 0, 0, 0, window
local stored_policy = f[4]
if pttl ~= -2 then
  s, c, p = dec(f[1], 0, MAX_EXACT), dec(f[2], 0, MAX_LIMIT), dec(f[3], 0, MAX_LIMIT)
  if stored_policy ~= policy then
    stored = stored_policy and dec(string.match(stored_policy, '^%d+:(%d+)$'), 1, MAX_WINDOW_MS)
  end
  if not (s and c and p and stored) then
    return fail('WRONGTYPE', NOT_OURS .. 'sliding window: a hash with other fields')
  end
end

-- A window without a TTL gets one, as a take gives it.
local healed = 0
if pttl == -1 then
  local ttl = math.max(s + 2 * stored - now, 1)
  redis.call('PEXPIRE', key, ttl)
  pttl, healed = ttl, 1
end

local kind = 'sliding window'
--#include allot_record at=5
if f[5] and tail == '' then
  return fail('WRONGTYPE', NOT_OURS .. 'sliding window: malformed reservation record', healed)
end

local sw = sliding_window(window)
local prev, cur, start, elapsed = sw.state(now, s, c, p, stored)
-- The previous period's weight in the estimate (the take's share; share
-- is max_share here).
local weighted = sw.share(prev, elapsed)
if weighted + cur + cost > limit then
  return {0, weighted + cur, limit > weighted + cur and limit - weighted - cur or 0, sw.reset(now, prev, cur, start),
    sw.retry(limit, now, prev, cur, start, elapsed, cost), 0, healed, 0}
end
local left = limit - weighted - cur
--#include allot_grant left=left
cur = cur + grant
local used = weighted + cur
-- Units kept of an earlier reservation count in the record only when
-- they counted in this same period.
local total = grant
if tail == ':' .. string.format('%d', start) then
  total = total + math.min(kept, held)
end
local rec = seq_s .. ':' .. total .. ':' .. string.format('%d', start)
if pttl == -2 then
  redis.call('HSET', key, 's', start, 'c', cur, 'p', prev, 'policy', policy, field, rec, 'ids', 0, 'qh', 0, 'qt', 0)
elseif start == s and prev == p and stored_policy == policy then
  redis.call('HSET', key, 'c', cur, field, rec)
else
  redis.call('HSET', key, 's', start, 'c', cur, 'p', prev, 'policy', policy, field, rec)
end
local ends = start + 2 * window
local ttl = ends - now
if pttl < ttl or pttl > ttl + 1 then
  redis.call('PEXPIRE', key, math.max(ttl, 1))
end
return {grant, used, limit > used and limit - used or 0, ttl, 0, window - elapsed, healed, 0}
