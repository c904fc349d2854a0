-- One decision on one token bucket (GCRA). See doc.go for the hash layout.
--
-- KEYS[1]  bucket hash
-- ARGV[1]  rate           canonical decimal, 1..1000000000: tokens per period
-- ARGV[2]  period_ms      canonical decimal, 1..2678400000
-- ARGV[3]  burst          canonical decimal, 1..1000000000: bucket size
-- ARGV[4]  cost           canonical decimal, 1..burst
-- ARGV[5]  dedupe_ms      canonical decimal, 1..2678400000: request-id horizon
-- ARGV[6]  max_ids        canonical decimal, 1..1000000: cap on r:* records
-- ARGV[7]  strict         "1": a live bucket with another policy is POLICY
-- ARGV[8]  request_id     "" for none, else 1..64 of [A-Za-z0-9_-]
--
-- Reply {allowed, replay, remaining, reset_ms, retry_after_ms, healed},
-- integers only. Error replies start with INVALID, CONFLICT, POLICY,
-- WRONGTYPE or REQUEST_IDS_FULL.
--
-- Time is Redis's own (TIME), in whole microseconds. The theoretical arrival
-- time (TAT) is kept exactly as tat + rem/rate microseconds, so every sum and
-- product below is an integer under 2^53 and nothing is rounded: the bucket
-- admits exactly burst + rate * elapsed / period tokens.

if #KEYS ~= 1 or #ARGV ~= 8 then
  return redis.error_reply('INVALID want 1 key and 8 arguments')
end
local key = KEYS[1]
local rate_s, period_s, burst_s, cost_s, dedupe_s, maxids_s, strict, id =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]

-- A canonical decimal in lo..hi, else nil (as in fixed_window_take.lua).
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

local rate = dec(rate_s, 1, 1000000000)
if not rate then
  return redis.error_reply('INVALID rate must be a decimal in 1..1000000000')
end
local period = dec(period_s, 1, 2678400000)
if not period then
  return redis.error_reply('INVALID period_ms must be a decimal in 1..2678400000')
end
local burst = dec(burst_s, 1, 1000000000)
if not burst then
  return redis.error_reply('INVALID burst must be a decimal in 1..1000000000')
end
-- The refill time from empty bounds every time the bucket stores.
if burst * period > 2678400000 * rate then
  return redis.error_reply('INVALID burst * period_ms / rate must be at most 2678400000')
end
local cost = dec(cost_s, 1, burst)
if not cost then
  return redis.error_reply('INVALID cost must be a decimal in 1..burst')
end
local dedupe = dec(dedupe_s, 1, 2678400000)
if not dedupe then
  return redis.error_reply('INVALID dedupe_ms must be a decimal in 1..2678400000')
end
local maxids = dec(maxids_s, 1, 1000000)
if not maxids then
  return redis.error_reply('INVALID max request ids must be a decimal in 1..1000000')
end
if strict ~= '0' and strict ~= '1' then
  return redis.error_reply('INVALID strict must be 0 or 1')
end
if id ~= '' and (#id > 64 or not string.match(id, '^[A-Za-z0-9_%-]+$')) then
  return redis.error_reply('INVALID request id must be 1..64 of A-Z a-z 0-9 _ -')
end
local policy = rate_s .. ':' .. period_s .. ':' .. burst_s

-- Exact integer quotient and remainder for 0 <= n < 2^53, 0 < d < 2^31.
local function divmod(n, d)
  local q = math.floor(n / d)
  local r = n - q * d
  if r < 0 then
    q, r = q - 1, r + d
  elseif r >= d then
    q, r = q + 1, r - d
  end
  return q, r
end
-- One token lasts period_us / rate = a + b/rate microseconds.
local period_us = period * 1000
local a, b = divmod(period_us, rate)
-- n tokens last (us, rem): us + rem/rate microseconds, 0 <= rem < rate.
-- n*b can reach 2^60, so it is multiplied in two halves.
local function span(n)
  local hi = math.floor(n / 65536)
  local lo = n - hi * 65536
  local q1, r1 = divmod(hi * b, rate)
  local q2, r2 = divmod(r1 * 65536 + lo * b, rate)
  return n * a + q1 * 65536 + q2, r2
end
local function add(u1, r1, u2, r2)
  local u, r = u1 + u2, r1 + r2
  if r >= rate then
    u, r = u + 1, r - rate
  end
  return u, r
end
local function sub(u1, r1, u2, r2)
  local u, r = u1 - u2, r1 - r2
  if r < 0 then
    u, r = u - 1, r + rate
  end
  return u, r
end
local function le(u1, r1, u2, r2)
  return u1 < u2 or (u1 == u2 and r1 <= r2)
end
-- Whole milliseconds from now until (u, r), rounded up; 0 if not after now.
local function ms_until(now, u, r)
  local du, dr = sub(u, r, now, 0)
  if du < 0 then
    return 0
  end
  if dr > 0 then
    du = du + 1
  end
  return math.floor((du + 999) / 1000)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)

-- pcall rather than a TYPE call: a key of another type fails this one read.
local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy', 'ids', 'qh', 'qt', 'r:' .. id)
if f.err then
  if string.sub(f.err, 1, 10) == 'WRONGTYPE ' then
    return redis.error_reply('WRONGTYPE key is not a quotad token bucket: it holds another type')
  end
  return f
end
local pttl = redis.call('PTTL', key)

local tat, rem, ids, qh, qt = now, 0, 0, 0, 0
local stored = f[3]
if pttl ~= -2 then
  tat = dec(f[1], 0, 9007199254740991)
  rem = dec(f[2], 0, 1000000000)
  ids = dec(f[4] or '0', 0, 1000000)
  qh = dec(f[5] or '0', 0, 9007199254740991)
  qt = dec(f[6] or '0', 0, 9007199254740991)
  if not (tat and rem and ids and qh and qt and qh <= qt) or type(stored) ~= 'string'
      or not string.match(stored, '^[0-9]+:[0-9]+:[0-9]+$') then
    return redis.error_reply('WRONGTYPE key is not a quotad token bucket: a hash with other fields')
  end
  if stored ~= policy then
    -- rem counts 1/rate of a microsecond of the rate it was written under;
    -- rounding it up to a whole microsecond never admits more.
    if rem > 0 then
      tat = tat + 1
    end
    rem = 0
  end
end

-- A TAT in the past is a full bucket: tokens beyond the burst never accrue.
if tat < now then
  tat, rem = now, 0
end
local tau_u, tau_r = span(burst)

-- Whole tokens in the bucket when the TAT is (u, r): the most n with
-- span(n) <= now + tau - TAT. Estimated in floating point, then made exact.
local function tokens(u, r)
  local su, sr = sub(now + tau_u, tau_r, u, r)
  if su < 0 then
    return 0
  end
  local n = math.floor((su + sr / rate) * rate / period_us)
  n = math.max(0, math.min(n, burst))
  while n < burst do
    local nu, nr = span(n + 1)
    if not le(nu, nr, su, sr) then
      break
    end
    n = n + 1
  end
  while n > 0 do
    local nu, nr = span(n)
    if le(nu, nr, su, sr) then
      break
    end
    n = n - 1
  end
  return n
end

-- The key lives until the bucket is full again, and as long as its newest
-- request-id record, whichever is later; never shorter than it already has.
local healed = 0
if pttl == -1 then
  -- Lost its TTL: give it back whatever follows, errors included.
  local ttl = ms_until(now, tat, rem)
  if ids > 0 then
    ttl = math.max(ttl, dedupe)
  end
  ttl = math.max(ttl, 1)
  redis.call('PEXPIRE', key, ttl)
  pttl, healed = ttl, 1
end

local function refuse(msg)
  if healed == 1 then
    msg = msg .. ' ' .. 'TTL_RESTORED'
  end
  return redis.error_reply(msg)
end

if strict == '1' and stored and stored ~= policy then
  return refuse('POLICY live bucket has rate:period_ms:burst ' .. stored)
end

if id ~= '' and f[7] then
  local rc, rr, rx = string.match(f[7], '^([0-9]+):([0-9]+):([0-9]+)$')
  rx = dec(rx, 0, 9007199254740991)
  if not rx or not dec(rr, 0, 1000000000) then
    return refuse('WRONGTYPE key is not a quotad token bucket: malformed request id record')
  end
  if rx > now_ms then
    if rc ~= cost_s then
      return refuse('CONFLICT request id was accepted with cost ' .. rc)
    end
    return {1, 1, tonumber(rr), ms_until(now, tat, rem), 0, healed}
  end
end

local new_u, new_r = add(tat, rem, span(cost))
local at_u, at_r = sub(new_u, new_r, tau_u, tau_r)
if not le(at_u, at_r, now, 0) then
  return {0, 0, tokens(tat, rem), ms_until(now, tat, rem), ms_until(now, at_u, at_r), healed}
end

local remaining = tokens(new_u, new_r)
local fields = {'tat', string.format('%d', new_u), 'rem', string.format('%d', new_r), 'policy', policy}
local ttl = ms_until(now, new_u, new_r)
-- Forget up to three records past their horizon, oldest first. A take adds
-- at most one record, so under any traffic the records stay bounded. Queue
-- entries are "<id>:<expiry ms>"; a record renewed after its entry was
-- queued is newer than the entry and stays.
local popped = 0
while popped < 3 and qh < qt do
  local q = redis.call('HGET', key, 'q:' .. string.format('%d', qh))
  local qid, qx = string.match(q or '', '^(.+):([0-9]+)$')
  qx = dec(qx, 0, 9007199254740991)
  if qx and qx > now_ms then
    break
  end
  redis.call('HDEL', key, 'q:' .. string.format('%d', qh))
  if qid and qid ~= id then
    local rec = redis.call('HGET', key, 'r:' .. qid)
    local rx = rec and dec(string.match(rec, ':([0-9]+)$'), 0, 9007199254740991)
    if rec and (not rx or rx <= now_ms) then
      redis.call('HDEL', key, 'r:' .. qid)
      ids = math.max(ids - 1, 0)
    end
  end
  qh = qh + 1
  popped = popped + 1
end
if id ~= '' then
  -- An expired record of this id is overwritten, so it is not counted again.
  local fresh = not f[7]
  if fresh and ids >= maxids then
    if popped > 0 then
      redis.call('HSET', key, 'ids', string.format('%d', ids), 'qh', string.format('%d', qh))
    end
    return refuse('REQUEST_IDS_FULL bucket holds ' .. ids .. ' request ids')
  end
  if fresh then
    ids = ids + 1
  end
  local exp = string.format('%d', now_ms + dedupe)
  table.insert(fields, 'r:' .. id)
  table.insert(fields, cost_s .. ':' .. string.format('%d', remaining) .. ':' .. exp)
  table.insert(fields, 'q:' .. string.format('%d', qt))
  table.insert(fields, id .. ':' .. exp)
  qt = qt + 1
  ttl = math.max(ttl, dedupe)
end
for _, v in ipairs({'ids', ids, 'qh', qh, 'qt', qt}) do
  table.insert(fields, type(v) == 'number' and string.format('%d', v) or v)
end
redis.call('HSET', key, unpack(fields))
redis.call('PEXPIRE', key, math.max(ttl, pttl, 1))
return {1, 0, remaining, ms_until(now, new_u, new_r), 0, healed}
