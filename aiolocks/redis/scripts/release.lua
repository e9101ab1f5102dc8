-- aiolocks: give holds back (compare-and-delete of our own fields) and
-- leave a fair queue. Idempotent: a retried release finds nothing and
-- returns 0, it can never remove somebody else's hold.
--
-- KEYS[1] holders hash   KEYS[2] fence counter   KEYS[3] fair queue   KEYS[4] queue timeouts
-- KEYS[5] tombstones (zset, score = expiry ms)
-- ARGV[1] channel to publish on   ARGV[2] queue member or ''
-- ARGV[3] tombstone ms: '0', or (cleanup of an acquire whose script may
--         still be on the wire) how long a field not found stays marked
--         as given up (in KEYS[5], scored by expiry), so that script
--         cannot grant it when it arrives late
-- ARGV[4..] field ids
-- Publishes on ARGV[1] when anything went: the member at the head of the
-- waiter queue, or 'released' when nobody is queued.
-- Returns the number of holds and queue entries removed.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tombstone = tonumber(ARGV[3])
local removed = 0
for i = 4, #ARGV do
  local gone = redis.call('HDEL', KEYS[1], ARGV[i])
  removed = removed + gone
  if gone == 0 and tombstone > 0 then
    redis.call('ZADD', KEYS[5], math.floor(now_us / 1000) + tombstone, ARGV[i])
    if redis.call('PTTL', KEYS[5]) < tombstone then
      redis.call('PEXPIRE', KEYS[5], tombstone)
    end
  end
end
if ARGV[2] ~= '' then
  -- a waiter leaving the queue head must wake the next one
  removed = removed + redis.call('LREM', KEYS[3], 0, ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  -- Idle lock: drop the fence counter too, so no key outlives its lock.
  -- Tokens restart from server time, which is already past the last token
  -- unless tokens were handed out faster than one per microsecond; keep
  -- the counter just long enough to cover that.
  local last = redis.call('GET', KEYS[2])
  if last then
    local ahead = tonumber(last) - now_us
    if ahead < 0 then
      redis.call('DEL', KEYS[2])
    else
      redis.call('PEXPIRE', KEYS[2], math.floor(ahead / 1000) + 2)
    end
  end
end
if removed > 0 then
  -- Wake the head of the waiter queue only (its member is the message),
  -- after dropping heads whose waiters stopped refreshing their entries;
  -- with no queue (shared modes, Redlock), everybody looks: 'released'.
  local head = redis.call('LINDEX', KEYS[3], 0)
  while head do
    local to = redis.call('ZSCORE', KEYS[4], head)
    if to and tonumber(to) > math.floor(now_us / 1000) then break end
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], head)
    head = redis.call('LINDEX', KEYS[3], 0)
  end
  redis.call('PUBLISH', ARGV[1], head or 'released')
end
return removed
