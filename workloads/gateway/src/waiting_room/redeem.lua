-- Redeems a pass on lease: marks its position used, once, if the pass has
-- not expired by the Redis clock (the clock its expiry was computed with).
-- The mark lasts only the lease unless commit makes it final, so a gateway
-- that dies mid-order frees the pass within seconds.
-- KEYS[1]: the position's used marker
-- ARGV[1]: the pass's expiry (Unix ms)
-- ARGV[2]: the lease (ms): a little longer than an order may take
-- ARGV[3]: this redemption's claim, so only it can be committed or given back
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
