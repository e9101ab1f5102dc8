-- aiolocks: the record store (aiolocks/redis/_records.py; docs/redis.md, "Records").
--
-- One prefix of records lives under one hash tag, so one Cluster slot:
--   KEYS[1] index     <key prefix>{records:<prefix>}          hash: child -> '1', '#' -> last version
--   KEYS[2] record    <key prefix>{records:<prefix>}/<child>  hash: v value, n version,
--                                                             w id of the last write, o owner (ephemeral)
--   KEYS[3] outcome   <key prefix>{records:<prefix>}!<op id>  string, short-lived: this op is settled
-- ARGV[1] op   ARGV[2] child   ARGV[3] channel ('' publishes nothing)   ARGV[4] op id
-- ARGV[5] how long an outcome key lives (ms)   ARGV[6..] by op (see each branch)
--
-- Versions: max(last version + 1, server time in microseconds). The index (and
-- with it the last version) outlives every write of its children by LINGER ms,
-- so a version never comes back, even across a delete and re-create, unless
-- the server's clock steps back by more than LINGER between the index going
-- and the next write.
local LINGER = 60000
local idx, rec, outcome = KEYS[1], KEYS[2], KEYS[3]
local op, child, channel, opid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local outcome_ms = tonumber(ARGV[5])

local function fmt(n) return string.format('%.0f', n) end

local function publish()
  if channel ~= '' then redis.call('PUBLISH', channel, child) end
end

local function next_version()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fresh = redis.call('EXISTS', idx) == 0
  local v = math.max(tonumber(redis.call('HGET', idx, '#') or '0') + 1, now)
  redis.call('HSET', idx, '#', fmt(v))
  if fresh then redis.call('PEXPIRE', idx, LINGER) end
  return v
end

-- The index lives at least LINGER ms past a child that lives ms more (-1: forever).
local function cover(ms)
  if ms == -1 then redis.call('PERSIST', idx); return end
  local left = redis.call('PTTL', idx)
  if left >= 0 and left < ms + LINGER then redis.call('PEXPIRE', idx, ms + LINGER) end
end

-- Drop the children that are gone; the index's expiry from those left.
local function settle()
  local longest, forever = 0, false
  for _, c in ipairs(redis.call('HKEYS', idx)) do
    if c ~= '#' then
      local left = redis.call('PTTL', idx .. '/' .. c)
      if left == -2 then redis.call('HDEL', idx, c)
      elseif left == -1 then forever = true
      elseif left > longest then longest = left end
    end
  end
  if forever then redis.call('PERSIST', idx)
  elseif redis.call('EXISTS', idx) == 1 then redis.call('PEXPIRE', idx, longest + LINGER) end
end

local function settled()
  redis.call('SET', outcome, '1', 'PX', outcome_ms)
end

-- create (ARGV[6] value, ARGV[7] ttl ms or 0, ARGV[8] owner or '': ephemeral)
-- -> {1, version} | {0} exists | {-1} given up by its caller (abandon came first)
if op == 'create' then
  if redis.call('EXISTS', outcome) == 1 then return {-1} end
  local found = redis.call('HMGET', rec, 'n', 'w')
  if found[1] then
    if found[2] == opid then return {1, found[1]} end -- a resend: the same answer
    return {0}
  end
  local ttl, owner = tonumber(ARGV[7]), ARGV[8]
  local v = fmt(next_version())
  redis.call('HSET', rec, 'v', ARGV[6], 'n', v, 'w', opid)
  if owner ~= '' then redis.call('HSET', rec, 'o', owner) end
  if ttl > 0 then redis.call('PEXPIRE', rec, ttl) end
  redis.call('HSET', idx, child, '1')
  if ttl > 0 then cover(ttl) else cover(-1) end
  publish()
  return {1, v}
end

-- update (ARGV[6] value, ARGV[7] ttl ms or 0, ARGV[8] expected version)
-- -> {1, version} | {0} absent or changed | {-2} an ephemeral record takes no ttl
if op == 'update' then
  local found = redis.call('HMGET', rec, 'n', 'w', 'o')
  if not found[1] then return {0} end
  if found[2] == opid then return {1, found[1]} end -- a resend: the same answer
  if found[1] ~= ARGV[8] then return {0} end
  local ttl = tonumber(ARGV[7])
  if found[3] and ttl > 0 then return {-2} end
  local before = redis.call('PTTL', rec)
  local v = fmt(next_version())
  redis.call('HSET', rec, 'v', ARGV[6], 'n', v, 'w', opid)
  if not found[3] then
    if ttl > 0 then redis.call('PEXPIRE', rec, ttl) else redis.call('PERSIST', rec) end
  end
  local after = redis.call('PTTL', rec)
  if before == -1 and after ~= -1 then settle() else cover(after) end
  publish()
  return {1, v}
end

-- delete (ARGV[6] expected version or '', ARGV[7] owner or '') -> 1 deleted | 0
if op == 'delete' then
  if redis.call('EXISTS', outcome) == 1 then return 1 end -- a resend of a delete that ran
  local found = redis.call('HMGET', rec, 'n', 'o')
  if not found[1] then return 0 end
  if ARGV[6] ~= '' and found[1] ~= ARGV[6] then return 0 end
  if ARGV[7] ~= '' and found[2] ~= ARGV[7] then return 0 end
  local before = redis.call('PTTL', rec)
  redis.call('DEL', rec)
  redis.call('HDEL', idx, child)
  settled()
  if before == -1 then settle() else cover(0) end
  publish()
  return 1
end

-- abandon: the create/join of this op id went unanswered; undo it if it ran,
-- and make it lose if it arrives later -> 1 undone | 0
if op == 'abandon' then
  settled()
  if redis.call('HGET', rec, 'w') ~= opid then return 0 end
  redis.call('DEL', rec)
  redis.call('HDEL', idx, child)
  settle()
  publish()
  return 1
end

-- renew (ARGV[6] lease ms, ARGV[7] owner) -> 1 | 0 gone or not ours
if op == 'renew' then
  if redis.call('HGET', rec, 'o') ~= ARGV[7] then return 0 end
  local lease = tonumber(ARGV[6])
  redis.call('PEXPIRE', rec, lease)
  cover(lease)
  return 1
end

-- read -> {value, version, ephemeral 0/1, PTTL ms} | {}
if op == 'read' then
  local found = redis.call('HMGET', rec, 'v', 'n', 'o')
  if not found[2] then return {} end
  return {found[1], found[2], found[3] and 1 or 0, redis.call('PTTL', rec)}
end

-- snapshot -> {child, value, version, ephemeral, PTTL, ...}; drops children gone
if op == 'snapshot' then
  local out, gone = {}, false
  for _, c in ipairs(redis.call('HKEYS', idx)) do
    if c ~= '#' then
      local key = idx .. '/' .. c
      local found = redis.call('HMGET', key, 'v', 'n', 'o')
      if found[2] then
        out[#out + 1] = c
        out[#out + 1] = found[1]
        out[#out + 1] = found[2]
        out[#out + 1] = found[3] and 1 or 0
        out[#out + 1] = redis.call('PTTL', key)
      else
        gone = true
      end
    end
  end
  if gone then settle() end
  return out
end
return redis.error_reply('aiolocks records: unknown op ' .. op)
