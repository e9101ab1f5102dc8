-- aiolocks: the waiter queue's entries and their deadlines. Not a script of
-- its own: _scripts.source() puts it in front of acquire.lua and release.lua.
--
-- A queue entry (KEYS[2], a list) is "<field>|<lease ms>|<participant>|<d>".
-- d is 0 for an entry that a script queued: its deadline is its score in the
-- queue timeouts (KEYS[3], a zset), which every try of its waiter moves on.
-- d > 0 for an entry that its client queued with plain commands (RPUSHX, no
-- script: it had just seen the lock go to another process): d is then the
-- entry's deadline in server ms, as the client reckoned it from the server
-- time of its last release. A script scores such an entry only once its own
-- d is less than half of QUEUE_CAP away, so an entry further from d than
-- that has no score, and a hand-off to it needs neither ZSCORE nor ZREM.
-- Old entries and entries written by hand (no trailing "|<digits>") count
-- as d = 0.
local QUEUE_CAP = 5000  -- the longest queue entry timeout (QUEUE_TIMEOUT in _driver.py), ms

-- The deadline an entry carries itself (0: none). One further in the future
-- than any client could have reckoned (a clock that jumped) is not trusted.
local function own_deadline(m, now_ms)
  local d = tonumber(string.match(m, '|(%d+)$')) or 0
  if d > now_ms + QUEUE_CAP + 1000 then d = 0 end
  return d
end

-- True when the entry has no score in the queue timeouts (see above).
local function unscored(d, now_ms)
  return d - QUEUE_CAP / 2 > now_ms
end

-- The entry's deadline (the later of its own and its score) and whether it
-- has a score.
local function entry_deadline(m, now_ms, qtimeouts)
  local d = own_deadline(m, now_ms)
  if unscored(d, now_ms) then return d, false end
  local s = redis.call('ZSCORE', qtimeouts, m)
  if not s then return d, false end
  s = tonumber(s)
  if s > d then d = s end
  return d, true
end

