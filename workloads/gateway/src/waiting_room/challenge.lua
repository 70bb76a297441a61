-- The start of every script that spends a join challenge: the Redis
-- clock, and the spend.

-- The Redis clock, Unix microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Spends a join challenge. marker: its spent marker; expires_at_ms: its
-- expiry (Unix ms, Redis clock); now_ms: the Redis clock; holder: what
-- spends it (an order's request id, so that order's retry may spend it
-- again), or '' for a spend that is never repeated.
-- Returns 1 when spent, -1 when spent by another, -2 when expired; only a
-- first spend writes.
local function spend(marker, expires_at_ms, now_ms, holder)
  if now_ms >= tonumber(expires_at_ms) then
    return -2
  end
  -- Spent until it expires: after that it is refused as expired anyway.
  if redis.call('SET', marker, holder, 'NX', 'PXAT', expires_at_ms) then
    return 1
  end
  if holder ~= '' and redis.call('GET', marker) == holder then
    return 1
  end
  return -1
end
