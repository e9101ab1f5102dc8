-- aiolocks: take `n` holds of one lock, or say how long to wait.
--
-- One hash per lock (KEYS[1]); one field per hold, named by the client:
--   field = "<client-uuid>:<per-acquisition id>"
--   value = "<expiry ms (server TIME)>|<fencing token>|<mode>|<participant>"
-- Per-hold expiries let one hash carry a mutex, semaphore leases or a
-- read/write lock; the key itself also gets a PEXPIRE covering its longest
-- hold, so a crashed client leaves nothing behind once its leases lapse.
-- Two reserved kinds of field live in the same hash, so that the one
-- HGETALL below reads everything a try needs:
--   '#'        the last fencing token handed out or reserved (the fence
--              counter; an exclusive hold reserves a block of 16, see below)
--   '!<field>' a tombstone: that attempt was given up while its script was
--              on the wire (release.lua); value = expiry ms. Never granted.
--
-- KEYS[1] holders hash   KEYS[2] waiter queue (list)
-- KEYS[3] waiter queue timeouts (zset, score = expiry ms)
-- ARGV[1] mode: x (exclusive), l (lease), r (read), w (write)
-- ARGV[2] max holders for x/l      ARGV[3] lease ms
-- ARGV[4] participant
-- ARGV[5] waiter queue: '0' none; '1' fair FIFO; 'q' queue without FIFO
--         (unfair mutex: the queue is only for hand-off); 'Q' the same, but
--         this attempt has not queued yet (its first try)
-- ARGV[6] queue entry timeout ms   ARGV[7] field of the write hold being downgraded, or ''
-- ARGV[8] queue member "<field>|<lease ms>|<participant>|<deadline ms or 0>"
--         (queue.lua), or ''
-- ARGV[9..] the field ids, one per hold asked for
--
-- A queued exclusive waiter is handed the lock by release.lua directly (its
-- field written, the token published to its process): it does not try again.
--
-- Returns {1, token...} when granted, {0, wait_ms} otherwise, where wait_ms
-- bounds how long a waiter may sleep: expiry publishes nothing, so a waiter
-- must look again when the hold blocking it runs out (-1: no bound known).
local holders, queue, qtimeouts = KEYS[1], KEYS[2], KEYS[3]
local mode = ARGV[1]
local max_holders = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local who = ARGV[4]
local qmode = ARGV[5]
local queue_timeout = tonumber(ARGV[6])
local downgrade = ARGV[7]
local member = ARGV[8]
local n = #ARGV - 8
local tomb_field = '!' .. ARGV[9]

-- Server time, never client clocks (Redisson #1104/#2099). Read before any write.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Lazily reclaim lapsed holds (a crashed holder's permit comes back) and
-- find what blocks us, in one read of the hash (none when the lock is free).
local live, min_exp, max_writer_exp, resend = 0, nil, nil, false
local last, tomb_until, tombstoned = 0, 0, false
local lapsed = {}
local all = redis.call('HGETALL', holders)
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if f == '#' then
    last = tonumber(v) or 0
  elseif string.byte(f, 1) == 33 then  -- '!': a tombstone
    local exp = tonumber(v)
    if exp == nil or exp <= now_ms then
      lapsed[#lapsed + 1] = f
    else
      if exp > tomb_until then tomb_until = exp end
      if f == tomb_field then tombstoned = true end
    end
  elseif f == ARGV[9] and v ~= '0' then  -- ('0': given back, see release.lua)
    resend = true
  else
    local exp, _, md = string.match(v, '^(%d+)|(%d+)|(%a)|')
    exp = tonumber(exp)
    if exp == nil or exp <= now_ms then
      lapsed[#lapsed + 1] = f
    else
      live = live + 1
      if min_exp == nil or exp < min_exp then min_exp = exp end
      if md == 'w' and f ~= downgrade then
        if max_writer_exp == nil or exp > max_writer_exp then max_writer_exp = exp end
      end
    end
  end
end
for i = 1, #lapsed, 500 do
  redis.call('HDEL', holders, unpack(lapsed, i, math.min(i + 499, #lapsed)))
end

-- Our own fields are there: a resent script (reply lost, client retried), or
-- a waiter that release.lua handed the lock to while it was not listening.
-- Answer with the same grant instead of taking a second hold, with the
-- lease restarted now, since the client measures the lease from its last
-- send. Fields are written all or nothing, so the first one decides.
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
if qmode == '1' and free then
  -- Fair: only the queue head may take a free lock. A head whose waiter
  -- stopped refreshing its entry (it died) is dropped, so it cannot block
  -- the queue.
  local dropped, hto = false, nil
  head = redis.call('LINDEX', queue, 0)
  while head and head ~= member do
    local to, scored = entry_deadline(head, now_ms, qtimeouts)
    if to > now_ms then
      hto = to
      break
    end
    redis.call('LPOP', queue)
    if scored then redis.call('ZREM', qtimeouts, head) end
    dropped = true
    head = redis.call('LINDEX', queue, 0)
  end
  if head and head ~= member then
    free = false
    -- look again when the head's entry would time out, should its waiter die
    if bound == nil or hto < bound then bound = hto end
    if dropped then
      -- the dead head took the last release's hand-off with it: tell the
      -- live one to look (on its process's channel)
      local prefix = string.match(holders, '^([^{]*)')
      redis.call('PUBLISH', prefix .. 'grant:' .. string.match(head, '^([^:]*)'), '- ' .. head)
    end
  end
end

if not free then
  -- Not for an attempt its client gave up while this script was on the
  -- wire (release.lua left a tombstone): never queue it.
  if qmode ~= '0' and not tombstoned then
    -- Join the queue (or refresh our entry's timeout): the next release
    -- hands the lock to the head. O(1) whatever the queue's length for an
    -- entry a script queued; one its client queued itself (queue.lua) is
    -- looked for in the list when refreshed, and scored only near its own
    -- deadline.
    local own = own_deadline(member, now_ms)
    if own == 0 then
      if redis.call('ZADD', qtimeouts, now_ms + queue_timeout, member) == 1 then
        redis.call('RPUSH', queue, member)
      end
    else
      if qmode == 'Q' or not redis.call('LPOS', queue, member) then
        redis.call('RPUSH', queue, member)
      end
      if not unscored(own, now_ms) then
        redis.call('ZADD', qtimeouts, now_ms + queue_timeout, member)
      end
    end
    -- Both keys outlive every live entry: each try leaves them at least half
    -- an entry's timeout, and a live waiter tries at least three times per
    -- timeout. Never shortened (another waiter's timeout may be longer).
    if redis.call('PTTL', qtimeouts) < queue_timeout / 2 then
      redis.call('PEXPIRE', qtimeouts, queue_timeout)
      redis.call('PEXPIRE', queue, queue_timeout)
    end
  end
  if tombstoned or bound == nil then return {0, -1} end
  local w = bound - now_ms
  if w < 1 then w = 1 end
  return {0, w}
end

-- A tombstone: the client gave this attempt up while this script was on
-- the wire, and its cleanup got here first. Never grant.
if tombstoned then
  return {0, -1}
end

if head == member then
  redis.call('LPOP', queue)
  redis.call('ZREM', qtimeouts, member)
elseif qmode == 'q' then
  local own = own_deadline(member, now_ms)
  if own == 0 then
    if redis.call('ZREM', qtimeouts, member) == 1 then
      redis.call('LREM', queue, 1, member)
    end
  else
    redis.call('LREM', queue, 1, member)
    if not unscored(own, now_ms) then redis.call('ZREM', qtimeouts, member) end
  end
end

-- Granted. Fencing token: the counter, but never below server time in
-- microseconds, so the hash (counter included) can go when the lock goes
-- idle (release.lua) and tokens still never repeat or go backwards. The
-- holds and the counter are written in one HSET.
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local base = now_us
if last + 1 > base then base = last + 1 end
local exp_text = string.format('%.0f', now_ms + lease)
local res = {1}
local writes = {}
for i = 1, n do
  local tok = string.format('%.0f', base + i - 1)
  writes[#writes + 1] = ARGV[8 + i]
  writes[#writes + 1] = exp_text .. '|' .. tok .. '|' .. mode .. '|' .. who
  res[#res + 1] = tok
end
-- One exclusive hold reserves a block of TOKEN_BLOCK tokens: its process may
-- pass the hold on to its own waiting tasks, each with the next token of the
-- block (pass_on.lua, which rewrites the field for each), and the next grant
-- here still gets a larger token than any of them.
local reserve = 0
if mode == 'x' and n == 1 then reserve = 15 end  -- TOKEN_BLOCK - 1
writes[#writes + 1] = '#'
writes[#writes + 1] = string.format('%.0f', base + n - 1 + reserve)
for i = 1, #writes, 1000 do
  redis.call('HSET', holders, unpack(writes, i, math.min(i + 999, #writes)))
end
if live == 0 then
  -- the key's TTL is ours to set: our lease, or the tombstones' if longer
  local ttl = lease
  if tomb_until - now_ms > ttl then ttl = tomb_until - now_ms end
  redis.call('PEXPIRE', holders, ttl)
elseif redis.call('PTTL', holders) < lease then
  redis.call('PEXPIRE', holders, lease)
end
return res
