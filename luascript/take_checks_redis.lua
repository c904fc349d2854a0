-- The redis the take bodies of take_checks.lua see. takechecks.go joins this
-- text before the prelude, so that the prelude's helpers (fail, redis_now)
-- and every body name this local redis, not Redis's own: it sends every
-- command on to Redis's redis, with three differences.
--
--   - TIME is read from Redis once per run of the script and the same
--     answer given to every later TIME, so every check of both passes
--     decides at one instant.
--   - While mt.dry is set (the checking pass), every command but a read
--     (HMGET, HGET, HGETALL, PTTL) is dropped and answers 0: a body runs
--     to its decision and writes nothing.
--   - When the take has a request id, the record r:<id> each body writes
--     gets two more fields: the digest of the take's set of checks,
--     "m<hex>", then a copy of the record's last field, so that a reader
--     of the last field (a token bucket's or sliding window's expiry, which
--     their takes read to forget old records) and a reader of the leading
--     fields (a settle) read what they read in a single take's record. The
--     record each body reads has both taken off again, so a body reads the
--     record it wrote; mt.found keeps the digest that was on it ("" for a
--     record without one, nil when no record was read).
local mt = {dry = false, id = '', digest = '', found = nil, now = nil}
local MT_READS = {HMGET = true, HGET = true, HGETALL = true, PTTL = true}
local mt_redis = redis

local function mt_send(f, cmd, ...)
  local name = string.upper(cmd)
  if name == 'TIME' then
    if not mt.now then
      mt.now = mt_redis.call('TIME')
    end
    return {mt.now[1], mt.now[2]}
  end
  if mt.dry and not MT_READS[name] then
    return 0
  end
  if mt.id == '' or (name ~= 'HSET' and name ~= 'HMGET') then
    return f(cmd, ...)
  end
  local n = select('#', ...)
  local a = {...}
  local rec = 'r:' .. mt.id
  if name == 'HSET' then
    for i = 2, n - 1, 2 do
      if a[i] == rec then
        local v = a[i + 1]
        a[i + 1] = v .. ':m' .. mt.digest .. ':' .. string.match(v, '([^:]*)$')
      end
    end
    return f(cmd, unpack(a, 1, n))
  end
  local r = f(cmd, ...)
  if type(r) == 'table' and not r.err then
    for i = 2, n do
      local v = r[i - 1]
      if a[i] == rec and v then
        local head, d = string.match(v, '^(.*):m(%x+):[^:]*$')
        if head then
          r[i - 1], mt.found = head, d
        else
          mt.found = ''
        end
      end
    end
  end
  return r
end

local redis = {
  call = function(...) return mt_send(mt_redis.call, ...) end,
  pcall = function(...) return mt_send(mt_redis.pcall, ...) end,
  error_reply = mt_redis.error_reply,
  status_reply = mt_redis.status_reply,
}
