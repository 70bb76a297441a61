-- Spends a pass: marks its position used, once, if the pass has not expired
-- by the Redis clock (the clock its expiry was computed with).
-- KEYS[1]: the position's used marker
-- ARGV[1]: the pass's expiry (Unix ms)
-- ARGV[2]: the marker's lifetime (ms): outlives every pass of the position
-- ARGV[3]: this redemption's claim, so only it can be given back
-- Returns 1 redeemed, 0 already used, -1 expired.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now_ms >= tonumber(ARGV[1]) then
  return -1
end
if redis.call('SET', KEYS[1], ARGV[3], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
