-- aiolocks: give holds back (compare-and-delete of our own fields), leave
-- the waiter queue, and hand the lock to the queue head. Idempotent: a
-- retried release finds nothing and returns 0, it can never remove
-- somebody else's hold.
--
-- KEYS[1] holders hash   KEYS[2] fence counter   KEYS[3] waiter queue   KEYS[4] queue timeouts
-- KEYS[5] tombstones (zset, score = expiry ms)
-- ARGV[1] channel to publish on   ARGV[2] queue member or ''
-- ARGV[3] tombstone ms: '0', or (cleanup of an acquire whose script may
--         still be on the wire) how long a field not found stays marked
--         as given up (in KEYS[5], scored by expiry), so that script
--         cannot grant it when it arrives late
-- ARGV[4..] field ids
--
-- When anything went and a live waiter heads the queue (queue members are
-- "<field>|<lease ms>|<participant>", exclusive waiters), the lock is
-- handed to it right here: its field is written with its lease and a
-- fencing token, and "<token> <member>" is published on its process's
-- channel "<key prefix>grant:<client uuid>" (the first half of its field).
-- The waiter only learns that it holds the lock; it does not try again. If
-- the lock is not free for it, "- <member>" tells it to try. With nobody
-- queued, 'released <n>' goes out on ARGV[1] (shared modes, Redlock): n
-- holds were given back.
-- Returns the number of holds and queue entries removed.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local tombstone = tonumber(ARGV[3])
local removed = 0
for i = 4, #ARGV do
  local gone = redis.call('HDEL', KEYS[1], ARGV[i])
  removed = removed + gone
  if gone == 0 and tombstone > 0 then
    redis.call('ZADD', KEYS[5], now_ms + tombstone, ARGV[i])
    if redis.call('PTTL', KEYS[5]) < tombstone then
      redis.call('PEXPIRE', KEYS[5], tombstone)
    end
  end
end
local freed = removed
if ARGV[2] ~= '' then
  removed = removed + redis.call('LREM', KEYS[3], 0, ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
end
-- The queue head, after dropping heads whose waiters stopped refreshing
-- their entries (they died): a dead waiter cannot hold up the queue.
local head = nil
if removed > 0 then head = redis.call('LPOP', KEYS[3]) end
while head do
  local to = redis.call('ZSCORE', KEYS[4], head)
  if to and tonumber(to) > now_ms then break end
  redis.call('ZREM', KEYS[4], head)
  head = redis.call('LPOP', KEYS[3])
end
local busy = redis.call('EXISTS', KEYS[1]) == 1

if head then
  local prefix = string.match(KEYS[1], '^([^{]*)')
  local channel = prefix .. 'grant:' .. string.match(head, '^([^:]*)')
  local field, lease, who = string.match(head, '^([^|]+)|(%d+)|(.*)$')
  if busy or not field then
    -- not free for it (a lapsed hold not reclaimed yet), or an entry we
    -- cannot grant: back to the head, and its waiter looks itself
    redis.call('LPUSH', KEYS[3], head)
    local ttl = redis.call('PTTL', KEYS[4])  -- the list may have been emptied
    if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) end
    redis.call('PUBLISH', channel, '- ' .. head)
  else
    redis.call('ZREM', KEYS[4], head)
    lease = tonumber(lease)
    -- the fencing token exactly as acquire.lua mints it
    local last = tonumber(redis.call('GET', KEYS[2]) or '0')
    local base = now_us
    if last + 1 > base then base = last + 1 end
    local tok = string.format('%.0f', base)
    redis.call('HSET', KEYS[1], field, string.format('%.0f', now_ms + lease) .. '|' .. tok .. '|x|' .. who)
    redis.call('SET', KEYS[2], tok, 'PX', lease)
    redis.call('PEXPIRE', KEYS[1], lease)
    redis.call('PUBLISH', channel, tok .. ' ' .. head)
    return removed
  end
end

if not busy then
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
-- "released <holds freed>": a process rings at most that many of its
-- one-lease waiters (the others of its waiters all look)
if removed > 0 and not head then
  redis.call('PUBLISH', ARGV[1], 'released ' .. freed)
end
return removed
