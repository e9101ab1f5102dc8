-- aiolocks: give holds back (compare-and-delete of our own fields), leave
-- the waiter queue, and hand the lock to the queue head. Idempotent: a
-- retried release finds nothing and returns 0, it can never remove
-- somebody else's hold.
--
-- KEYS[1] holders hash (with the fence counter '#' and tombstones '!<field>',
--         see acquire.lua)   KEYS[2] waiter queue   KEYS[3] queue timeouts
-- ARGV[1] channel to publish 'released' on, or '' when nobody listens there
-- ARGV[2] queue member or ''
-- ARGV[3] tombstone ms: '0', or (cleanup of an acquire whose script may
--         still be on the wire) how long a field not found stays marked
--         as given up (a '!<field>' field, valued by its expiry), so that
--         script cannot grant it when it arrives late
-- ARGV[4] a queue member of the releasing process to hand the lock to
--         before the queue head (a local hand-off: no PUBLISH, the process
--         tells its waiter itself), or ''; '+<member>' for one that waits
--         in its process only (not in the queue)
-- ARGV[5..] field ids; then (not with a tombstone) queue members of the
--         releasing process to take out of the queue: waiters that hold
--         the lock since (it passed them this hold, see pass_on.lua)
--         or left. Field ids never contain '|'; queue members always do.
--
-- When anything went and a live waiter heads the queue (queue members are
-- "<field>|<lease ms>|<participant>|<deadline>", exclusive waiters, see
-- queue.lua; not one whose field has a live tombstone), the lock is
-- handed to it right here: its field is written with its lease and a
-- fencing token, and "<token> <member>" is published on its process's
-- channel "<key prefix>grant:<client uuid>" (the first half of its field).
-- The waiter only learns that it holds the lock; it does not try again. If
-- the lock is not free for it, "- <member>" tells it to try. With nobody
-- queued, 'released <n>' goes out on ARGV[1] (shared modes, Redlock): n
-- holds were given back.
-- Returns the number of holds and queue entries removed; {removed, token}
-- when the lock went to ARGV[4]; {removed, -1, server time ms} when it went
-- to the head of the queue (a waiter of another process, or of another
-- backend): the releasing process then knows the lock is busy and its
-- queue is in use, and may queue its next waiter with plain commands.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local tombstone = tonumber(ARGV[3])
local removed = 0
if tombstone > 0 then
  local marked = false
  for i = 5, #ARGV do
    -- (a field marked given back, '0', is deleted but counts for nothing)
    local was = redis.call('HGET', KEYS[1], ARGV[i])
    if was then redis.call('HDEL', KEYS[1], ARGV[i]) end
    if was and was ~= '0' then removed = removed + 1 end
    if not was then
      redis.call('HSET', KEYS[1], '!' .. ARGV[i], now_ms + tombstone)
      marked = true
    end
  end
  if marked and redis.call('PTTL', KEYS[1]) < tombstone then
    redis.call('PEXPIRE', KEYS[1], tombstone)
  end
end
-- Our fields are deleted below, only where the hash stays (an idle lock's
-- hash is deleted whole): one HGETALL finds them and what else is there.
-- A hand-off does not delete them: it marks them given back ('0') in the
-- HSET that writes the new holder's field, one command less per hand-off.
-- Marks count as nothing (a retried release finds nothing to free) and go
-- with the next HDEL, or once MARKS of them have gathered.
local MARKS = 8
local mine, gone, marks = {}, {}, {}
if tombstone == 0 then
  for i = 5, #ARGV do
    if string.find(ARGV[i], '|', 1, true) then
      redis.call('LREM', KEYS[2], 0, ARGV[i])
      if not unscored(own_deadline(ARGV[i], now_ms), now_ms) then
        redis.call('ZREM', KEYS[3], ARGV[i])
      end
    else
      mine[ARGV[i]] = true
    end
  end
end
-- What is left: holds (busy), the fence counter, live tombstones.
local busy, last, tomb_until, tombs = false, nil, 0, {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = all[i]
  if all[i + 1] == '0' then
    marks[#marks + 1] = f
  elseif mine[f] then
    gone[#gone + 1] = f
  elseif f == '#' then
    last = tonumber(all[i + 1])
  elseif string.byte(f, 1) == 33 then
    local exp = tonumber(all[i + 1]) or 0
    if exp > now_ms then tombs[f] = true end
    if exp > tomb_until then tomb_until = exp end
  else
    busy = true
  end
end
removed = removed + #gone
local freed = removed
if ARGV[2] ~= '' then
  removed = removed + redis.call('LREM', KEYS[2], 0, ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
end
if removed == 0 then return 0 end
local function drop_ours()
  for _, f in ipairs(marks) do gone[#gone + 1] = f end
  if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
end
-- The waiter to hand the lock to: the releasing process's own, if it can
-- have it (one in the queue: still there and live, then taken out of the
-- list wherever it is; one waiting in its process only, '+<member>': not
-- given up, no tombstone); else the queue head, after dropping heads whose
-- waiters stopped refreshing their entries (they died): a dead waiter
-- cannot hold up the queue.
local head, here, queued, scored = nil, false, true, false
-- a waiter that gave up (its cleanup left a tombstone for its field) is
-- skipped even when its entry arrived after that cleanup
local function given_up(m)
  return tombs['!' .. string.match(m, '^([^|]*)')]
end
local prefer = ARGV[4]
if prefer ~= '' and freed > 0 and not busy then
  if string.byte(prefer, 1) == 43 then  -- '+'
    local m = string.sub(prefer, 2)
    if not given_up(m) then
      head, here, queued = m, true, false
    end
  else
    local to
    to, scored = entry_deadline(prefer, now_ms, KEYS[3])
    if to > now_ms and redis.call('LREM', KEYS[2], 1, prefer) == 1 then
      head, here = prefer, true
    end
  end
end
if not head then head = redis.call('LPOP', KEYS[2]) end
while head and not here do
  local to
  to, scored = entry_deadline(head, now_ms, KEYS[3])
  if to > now_ms and not given_up(head) then break end
  if scored then redis.call('ZREM', KEYS[3], head) end
  head = redis.call('LPOP', KEYS[2])
end

if head then
  local prefix = string.match(KEYS[1], '^([^{]*)')
  local channel = prefix .. 'grant:' .. string.match(head, '^([^:]*)')
  local field, lease, who = string.match(head, '^([^|]+)|(%d+)|(.*)$')
  if who then who = string.match(who, '^(.*)|%d+$') or who end
  if busy or not field then
    drop_ours()
    -- not free for it (a lapsed hold not reclaimed yet), or an entry we
    -- cannot grant: back to the head, and its waiter looks itself
    redis.call('LPUSH', KEYS[2], head)
    local ttl = redis.call('PTTL', KEYS[3])  -- the list may have been emptied
    if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
    redis.call('PUBLISH', channel, '- ' .. head)
  else
    if queued and scored then redis.call('ZREM', KEYS[3], head) end
    lease = tonumber(lease)
    -- the fencing token exactly as acquire.lua mints it
    local base = now_us
    if last and last + 1 > base then base = last + 1 end
    -- (and its block of 16 reserved: see acquire.lua)
    local tok = string.format('%.0f', base)
    local writes = {
      field, string.format('%.0f', now_ms + lease) .. '|' .. tok .. '|x|' .. who,
      '#', string.format('%.0f', base + 15),
    }
    if #marks + #gone >= MARKS then
      drop_ours()
    else
      for _, f in ipairs(gone) do
        writes[#writes + 1] = f
        writes[#writes + 1] = '0'
      end
    end
    redis.call('HSET', KEYS[1], unpack(writes))
    if tomb_until - now_ms > lease then lease = tomb_until - now_ms end
    redis.call('PEXPIRE', KEYS[1], lease)
    if here then return {removed, tok} end
    redis.call('PUBLISH', channel, tok .. ' ' .. head)
    return {removed, -1, string.format('%.0f', now_ms)}
  end
end

if not busy then
  -- Idle lock: the hash goes (fence counter included), so no key outlives
  -- its lock. Tokens restart from server time, which is already past the
  -- last token unless tokens were handed out faster than one per
  -- microsecond; keep the counter just long enough to cover that, and
  -- live tombstones until they lapse.
  local keep = 0
  if last and last >= now_us then keep = math.floor((last - now_us) / 1000) + 2 end
  if tomb_until - now_ms > keep then keep = tomb_until - now_ms end
  if keep > 0 then
    drop_ours()
    redis.call('PEXPIRE', KEYS[1], keep)
  else
    redis.call('DEL', KEYS[1])
  end
elseif not head then
  drop_ours()
end
-- "released <holds freed>": a process rings at most that many of its
-- one-lease waiters (the others of its waiters all look)
if not head and ARGV[1] ~= '' then
  redis.call('PUBLISH', ARGV[1], 'released ' .. freed)
end
return removed
