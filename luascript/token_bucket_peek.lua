#!lua flags=no-writes
-- Reads one token bucket without writing anything, not even a missing TTL.
-- The flags line lets Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  bucket hash
-- ARGV[1]  rate           canonical decimal, 1..1000000000
-- ARGV[2]  period_ms      canonical decimal, 1..2678400000
-- ARGV[3]  burst          canonical decimal, 1..1000000000
-- ARGV[4]  strict         "1": a live bucket with another policy is POLICY
--
-- Reply {remaining, reset_ms}, integers only: whole tokens in the bucket now
-- and milliseconds until it is full (0 when it is, or there is no bucket).
-- The arithmetic is token_bucket_take.lua's.

if #KEYS ~= 1 or #ARGV ~= 4 then
  return redis.error_reply('INVALID want 1 key and 4 arguments')
end
local key = KEYS[1]
local rate_s, period_s, burst_s, strict = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

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
if burst * period > 2678400000 * rate then
  return redis.error_reply('INVALID burst * period_ms / rate must be at most 2678400000')
end
if strict ~= '0' and strict ~= '1' then
  return redis.error_reply('INVALID strict must be 0 or 1')
end
local policy = rate_s .. ':' .. period_s .. ':' .. burst_s

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
local period_us = period * 1000
local a, b = divmod(period_us, rate)
local function span(n)
  local hi = math.floor(n / 65536)
  local lo = n - hi * 65536
  local q1, r1 = divmod(hi * b, rate)
  local q2, r2 = divmod(r1 * 65536 + lo * b, rate)
  return n * a + q1 * 65536 + q2, r2
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

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy')
if f.err then
  if string.sub(f.err, 1, 10) == 'WRONGTYPE ' then
    return redis.error_reply('WRONGTYPE key is not a quotad token bucket: it holds another type')
  end
  return f
end
if redis.call('EXISTS', key) == 0 then
  return {burst, 0}
end
local tat = dec(f[1], 0, 9007199254740991)
local rem = dec(f[2], 0, 1000000000)
if not tat or not rem or type(f[3]) ~= 'string' or not string.match(f[3], '^[0-9]+:[0-9]+:[0-9]+$') then
  return redis.error_reply('WRONGTYPE key is not a quotad token bucket: a hash with other fields')
end
if f[3] ~= policy then
  if strict == '1' then
    return redis.error_reply('POLICY live bucket has rate:period_ms:burst ' .. f[3])
  end
  if rem > 0 then
    tat = tat + 1
  end
  rem = 0
end
if tat < now then
  return {burst, 0}
end

local tau_u, tau_r = span(burst)
local su, sr = sub(now + tau_u, tau_r, tat, rem)
local n = 0
if su >= 0 then
  n = math.floor((su + sr / rate) * rate / period_us)
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
end
local du, dr = sub(tat, rem, now, 0)
if dr > 0 then
  du = du + 1
end
return {n, math.floor((du + 999) / 1000)}
