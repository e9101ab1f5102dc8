-- aiolocks: pass our exclusive hold to another task of our process
-- (RedisDriver._pass_on). The hold keeps its field, expiry, renewals and
-- loss watch; its value is rewritten to name the new holder and its
-- fencing token (the next of the block our grant reserved, see
-- acquire.lua), so that whoever reads the lock (participants, leader,
-- list) sees the true holder from now on. A compare-and-set: nothing is
-- written unless the field is still ours, live, exclusive and of the token
-- we gave the task passing it on.
--
-- KEYS[1] holders hash   KEYS[2] waiter queue   KEYS[3] queue timeouts
-- ARGV[1] our field id   ARGV[2] its fencing token now
-- ARGV[3] the new holder's fencing token   ARGV[4] the new holder's participant
-- ARGV[5] the new holder's queue member (it waited in the lock's queue), or ''
-- Returns 1 when passed on, 0 when the field was not as expected (the
-- caller then releases it the usual way).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local exp, tok, mode = string.match(v, '^(%d+)|(%d+)|([^|]*)|')
if exp == nil or tonumber(exp) <= now_ms or tok ~= ARGV[2] or mode ~= 'x' then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], exp .. '|' .. ARGV[3] .. '|x|' .. ARGV[4])
if ARGV[5] ~= '' then
  -- it holds the lock now: no longer a waiter in the queue
  redis.call('LREM', KEYS[2], 0, ARGV[5])
  redis.call('ZREM', KEYS[3], ARGV[5])
end
return 1
