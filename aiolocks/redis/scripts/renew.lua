-- aiolocks: the watchdog's renewal. Extends our own hold only if it is still
-- ours and not lapsed: it never re-creates a field, so a renewal that lands
-- after the unlock cannot resurrect the lease (Redisson #7272).
--
-- KEYS[1] holders hash   ARGV[1] lease ms   ARGV[2] field id
-- Returns 1 when renewed, 0 when the hold is gone (deleted, taken or lapsed).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local v = redis.call('HGET', KEYS[1], ARGV[2])
if not v then return 0 end
local exp, rest = string.match(v, '^(%d+)|(.*)$')
if exp == nil or tonumber(exp) <= now_ms then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], string.format('%.0f', now_ms + lease) .. '|' .. rest)
if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
return 1
