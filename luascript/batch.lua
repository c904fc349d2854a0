-- The batch driver: several decisions of one algorithm, of any op, in one
-- script call. batch.go composes a batch script per algorithm at init (and
-- one for the take of several limits and its give back: its body holds its
-- take bodies): the prelude, then BODY(i), which makes the function of
-- body i, then this driver. Body i is the i-th of its scripts
-- (batchFamilies in batch.go), its file's text wrapped as
--
--   function(KEYS, ARGV) <body> end
--
-- (a peek's flags line left out). Each body is the text its lone script
-- runs, so a decision in a batch checks and decides exactly as alone.
-- BODY makes a body's function the first time a decision of the call
-- needs it, so a call pays for the bodies it runs, not for all of them.
--
-- KEYS     every decision's keys, in decision order
-- ARGV[1]  the layout: three bytes per decision, in order: its body i
--          (1..NBODIES), how many of KEYS are its own (from the next
--          unused one), how many arguments are its own (0..255 each)
-- ARGV[2]  the references: "" when ARGV[3..] is every decision's
--          arguments in decision order; else one byte per argument of
--          every decision, in decision order, at most MAX_REFS: the
--          argument is ARGV[2 + that byte] (1..255), so that an argument
--          many decisions share (a policy's limit, a cost) is sent once
-- ARGV[3..]  the arguments, each decision's as its lone script takes
--          them in ARGV: every decision's in order, or each once when
--          ARGV[2] refers to them
--
-- Reply: an array with one element per decision, in order: the reply its
-- lone script would send (an error element for an error reply). A layout
-- that does not add up (no decision, more than MAX_BATCH, an unknown
-- body, keys or arguments left over or missing, a reference to no
-- argument) is INVALID for the whole call, decided before any decision
-- runs. Each decision is handed tables
-- of its own keys and arguments (two tables the driver reuses, so a body
-- must keep no reference to its KEYS or ARGV, which none does).
--
-- Each decision runs under pcall, so it is as atomic as alone and its
-- failure is its own element: a body's error reply (INVALID, CONFLICT,
-- POLICY, WRONGTYPE, REQUEST_IDS_FULL, CLOCK_SKEW) is returned by the body
-- before any write but a restored TTL, as its top says; an error Redis
-- raises in a body's redis.call (OOM) or a Lua runtime error ends that
-- decision there and is answered as its error element (Redis's error
-- with its code; "ERR " and the message for a runtime error), and the
-- next decision runs. What the earlier decisions wrote stays, as after
-- their lone calls, and so does what a body wrote before a runtime error,
-- as Redis keeps it after a lone script's. Every decision of the call
-- reads the same instant of Redis's clock (the prelude's redis_now).
--
-- Under maxmemory (noeviction) Redis refuses a script's first write that
-- may grow memory, and allows every write after one succeeded (it checks
-- only while the call has not written). Each body makes its deciding
-- write first (or a PEXPIRE, never refused, that restores a TTL), so:
-- while no decision of the call has written, decision k's first write is
-- refused exactly when its lone call's would be, the refusal is raised
-- before it wrote anything, and pcall answers it as decision k's own OOM
-- error; once an earlier decision wrote, decision k's writes are allowed,
-- as the later writes of one lone call are, and it decides in full. Either
-- way no decision is half-written, and a full Redis grows by at most one
-- call's decisions.

local header, refs = ARGV[1] or '', ARGV[2] or ''
local count = #header / 3
if count < 1 or count > MAX_BATCH or count % 1 ~= 0 then
  return redis.error_reply('INVALID batch: want a layout of 3 bytes for each of 1 to ' .. MAX_BATCH .. ' decisions')
end
-- The layout first, so that a malformed one runs nothing. One C call reads
-- all of it, and one the references.
local h = {string.byte(header, 1, -1)}
local kp, ap = 0, 0
for j = 1, 3 * count, 3 do
  if h[j] < 1 or h[j] > NBODIES then
    return redis.error_reply('INVALID batch: decision ' .. (j + 2) / 3 .. ' has no body ' .. h[j])
  end
  kp, ap = kp + h[j + 1], ap + h[j + 2]
end
local pool = #ARGV - 2
local ref
if refs == '' then
  if kp ~= #KEYS or ap ~= pool then
    return redis.error_reply('INVALID batch: the layout names ' .. kp .. ' keys and ' .. ap ..
      ' arguments, the call has ' .. #KEYS .. ' and ' .. pool)
  end
else
  if kp ~= #KEYS or ap ~= #refs or ap > MAX_REFS then
    return redis.error_reply('INVALID batch: the layout names ' .. kp .. ' keys and ' .. ap ..
      ' arguments, the call has ' .. #KEYS .. ' and ' .. #refs .. ' references (at most ' .. MAX_REFS .. ')')
  end
  ref = {string.byte(refs, 1, -1)}
  for x = 1, ap do
    if ref[x] < 1 or ref[x] > pool then
      return redis.error_reply('INVALID batch: reference ' .. x .. ' is to argument ' .. ref[x] .. ' of ' .. pool)
    end
  end
end

local fns, k, a, out = {}, {}, {}, {}
local pk, pa = 0, 0
kp, ap = 0, 0
for i = 1, count do
  local j = 3 * i - 2
  local b, nk, na = h[j], h[j + 1], h[j + 2]
  local body = fns[b]
  if not body then
    body = BODY(b)
    fns[b] = body
  end
  for x = 1, nk do
    k[x] = KEYS[kp + x]
  end
  for x = nk + 1, pk do
    k[x] = nil
  end
  if ref then
    for x = 1, na do
      a[x] = ARGV[2 + ref[ap + x]]
    end
  else
    for x = 1, na do
      a[x] = ARGV[2 + ap + x]
    end
  end
  for x = na + 1, pa do
    a[x] = nil
  end
  kp, ap, pk, pa = kp + nk, ap + na, nk, na
  local ok, r = pcall(body, k, a)
  if not ok then
    -- Redis raises a refused command's error reply as a string starting
    -- with its code (or, in some releases, as an error table, kept as it
    -- is); a Lua runtime error is a string without one.
    if type(r) ~= 'table' or type(r.err) ~= 'string' then
      r = tostring(r)
      if not string.find(r, '^%u[%u_]* ') then
        r = 'ERR ' .. r
      end
      r = redis.error_reply(r)
    end
  elseif r == nil then
    r = false
  end
  out[i] = r
end
return out
