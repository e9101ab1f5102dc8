-- aiolocks: take `n` holds of one lock, or say how long to wait.
--
-- One hash per lock (KEYS[1]); one field per hold, named by the client:
--   field = "<client-uuid>:<per-acquisition id>"
--   value = "<expiry ms (server TIME)>|<fencing token>|<mode>|<participant>"
-- Per-hold expiries let one hash carry a mutex, semaphore leases or a
-- read/write lock; the key itself also gets a PEXPIRE covering its longest
-- hold, so a crashed client leaves nothing behind once its leases lapse.
--
-- KEYS[1] holders hash   KEYS[2] fence counter   KEYS[3] fair queue (list)
-- KEYS[4] fair queue timeouts (zset, score = expiry ms)
-- KEYS[5] tombstones of attempts given up mid-flight (zset, score = expiry ms)
-- ARGV[1] mode: x (exclusive), l (lease), r (read), w (write)
-- ARGV[2] max holders for x/l      ARGV[3] lease ms
-- ARGV[4] participant              ARGV[5] '1' = fair FIFO queue, 'q' = waiter queue
--                                  without FIFO (a release wakes its head), '0' = none
-- ARGV[6] queue entry timeout ms   ARGV[7] field of the write hold being downgraded, or ''
-- ARGV[8] queue member, or ''      ARGV[9..] the field ids, one per hold asked for
--
-- Returns {1, token...} when granted, {0, wait_ms} otherwise, where wait_ms
-- bounds how long a waiter may sleep: expiry publishes nothing, so a waiter
-- must look again when the hold blocking it runs out (-1: no bound known).
local holders, fence, queue, qtimeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mode = ARGV[1]
local max_holders = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local who = ARGV[4]
local queued = ARGV[5] ~= '0'
local fair = ARGV[5] == '1'
local queue_timeout = tonumber(ARGV[6])
local downgrade = ARGV[7]
local member = ARGV[8]
local n = #ARGV - 8

-- Server time, never client clocks (Redisson #1104/#2099). Read before any write.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Lazily reclaim lapsed holds (a crashed holder's permit comes back) and
-- find what blocks us, in one read of the hash.
local live, min_exp, max_writer_exp, resend = 0, nil, nil, false
local all = redis.call('HGETALL', holders)
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  local exp, _, md = string.match(v, '^(%d+)|(%d+)|(%a)|')
  exp = tonumber(exp)
  if f == ARGV[9] then
    resend = true
  elseif exp == nil or exp <= now_ms then
    redis.call('HDEL', holders, f)
  else
    live = live + 1
    if min_exp == nil or exp < min_exp then min_exp = exp end
    if md == 'w' and f ~= downgrade then
      if max_writer_exp == nil or exp > max_writer_exp then max_writer_exp = exp end
    end
  end
end

-- A resent script (reply lost, client retried) finds its own fields: answer
-- the same again instead of taking a second hold, with the lease restarted
-- now, since the client measures the lease from its last send. Fields are
-- written all or nothing, so the first one decides.
if resend then
  local res = {1}
  local exp_text = string.format('%.0f', now_ms + lease)
  for i = 9, #ARGV do
    local v = redis.call('HGET', holders, ARGV[i])
    local _, tok, rest = string.match(v, '^(%d+)|(%d+)|(.*)$')
    redis.call('HSET', holders, ARGV[i], exp_text .. '|' .. tok .. '|' .. rest)
    res[#res + 1] = tok
  end
  if redis.call('PTTL', holders) < lease then redis.call('PEXPIRE', holders, lease) end
  return res
end

local free, bound
if mode == 'r' then
  free = max_writer_exp == nil
  bound = max_writer_exp
elseif mode == 'w' then
  free = live == 0
  bound = min_exp
else
  free = live + n <= max_holders
  bound = min_exp
end

local head = nil
if queued then
  -- Waiter queue: a release addresses its wake-up to the head only
  -- (release.lua). A waiter refreshes its entry's timeout on every try; an
  -- entry not refreshed in time (its waiter died) is dropped when it reaches
  -- the head, so a dead waiter cannot block the queue. Only the head is
  -- looked at: a try costs the same however long the queue is.
  local dropped = false
  head = redis.call('LINDEX', queue, 0)
  while head and head ~= member do
    local to = redis.call('ZSCORE', qtimeouts, head)
    if to and tonumber(to) > now_ms then break end
    redis.call('LPOP', queue)
    redis.call('ZREM', qtimeouts, head)
    dropped = true
    head = redis.call('LINDEX', queue, 0)
  end
  if fair and free and head and head ~= member then
    free = false
    if dropped then
      -- the dead head took the last release's wake-up with it: pass it on
      redis.call('PUBLISH', holders, head)
    end
  end
end

if not free then
  if queued then
    if not redis.call('ZSCORE', qtimeouts, member) then
      redis.call('RPUSH', queue, member)
      if not head then head = member end
    end
    redis.call('ZADD', qtimeouts, now_ms + queue_timeout, member)
    if redis.call('PTTL', qtimeouts) < queue_timeout then
      redis.call('PEXPIRE', qtimeouts, queue_timeout)
      redis.call('PEXPIRE', queue, queue_timeout)
    end
    if head ~= member then
      -- look again when the head's entry would time out, in case its waiter
      -- died holding the wake-up of the last release
      local hto = tonumber(redis.call('ZSCORE', qtimeouts, head))
      if hto and (bound == nil or hto < bound) then bound = hto end
    end
  end
  if bound == nil then return {0, -1} end
  local w = bound - now_ms
  if w < 1 then w = 1 end
  return {0, w}
end

-- A tombstone (release.lua): the client gave this attempt up while this
-- script was on the wire, and its cleanup got here first. Never grant.
local tomb = redis.call('ZSCORE', KEYS[5], ARGV[9])
if tomb and tonumber(tomb) > now_ms then
  return {0, -1}
end

if head == member then
  redis.call('LPOP', queue)
  redis.call('ZREM', qtimeouts, member)
elseif head and redis.call('ZREM', qtimeouts, member) == 1 then
  redis.call('LREM', queue, 1, member)
end

-- Granted. Fencing token: the counter, but never below server time in
-- microseconds, so the counter key can be deleted when the lock goes idle
-- (release.lua) and still never repeat or go backwards.
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', fence) or '0')
local base = now_us
if last + 1 > base then base = last + 1 end
local exp_text = string.format('%.0f', now_ms + lease)
local res = {1}
for i = 1, n do
  local tok = string.format('%.0f', base + i - 1)
  redis.call('HSET', holders, ARGV[8 + i], exp_text .. '|' .. tok .. '|' .. mode .. '|' .. who)
  res[#res + 1] = tok
end
redis.call('SET', fence, string.format('%.0f', base + n - 1), 'PX', lease)
if live == 0 or redis.call('PTTL', holders) < lease then redis.call('PEXPIRE', holders, lease) end
return res
