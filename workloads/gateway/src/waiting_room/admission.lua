-- Moves the admission frontier by the Redis server's clock: `rate` positions
-- per second, never past the last issued position. Any replica may call it
-- at any time: the credit is computed from the stored `last_us` and spent
-- atomically, so concurrent callers never admit the same second twice.
-- KEYS[1]: the frontier hash (`admitted`, `last_us`)
-- KEYS[2]: the position counter (last issued position)
-- ARGV[1]: admissions per second (>= 1)
-- Returns {admitted, issued, now_us}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate = tonumber(ARGV[1])
local issued = tonumber(redis.call('GET', KEYS[2])) or 0
local frontier = redis.call('HMGET', KEYS[1], 'admitted', 'last_us')
local admitted = tonumber(frontier[1]) or 0
local last = tonumber(frontier[2])
if admitted >= issued then
  -- Nobody waits; join restarts the credit clock when someone arrives, so
  -- an idle queue neither hoards credit nor costs a write per call.
  return {admitted, issued, now}
end
local changed = false
if not last or last > now then
  -- No clock yet, or the clock stepped back (a failover): restart it.
  last = now
  changed = true
end
if now - last > 1000000 then
  -- At most one second of credit at once: when no replica advanced for a
  -- while (all down), admission resumes at the rate, not in one burst.
  last = now - 1000000
end
local credit = math.floor((now - last) * rate / 1000000)
if credit > 0 then
  if admitted + credit >= issued then
    -- Caught up: the unused credit is dropped with the clock reset.
    admitted = issued
    last = now
  else
    -- Spend whole credits only; the fraction stays in `now - last`.
    admitted = admitted + credit
    last = last + math.ceil(credit * 1000000 / rate)
  end
  changed = true
end
if changed then
  redis.call('HSET', KEYS[1], 'admitted', string.format('%.0f', admitted),
    'last_us', string.format('%.0f', last))
end
return {admitted, issued, now}
