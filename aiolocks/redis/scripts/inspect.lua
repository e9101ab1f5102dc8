-- aiolocks: a consistent snapshot of one lock for participants().
-- KEYS[1] holders hash   KEYS[2] fair queue   KEYS[3] queue timeouts
-- Returns {now_ms, holders (flat field/value), queue members, timeouts (flat member/score)}.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {
  string.format('%.0f', now_ms),
  redis.call('HGETALL', KEYS[1]),
  redis.call('LRANGE', KEYS[2], 0, -1),
  redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES'),
}
