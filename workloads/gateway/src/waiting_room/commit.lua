-- Makes a redemption final once its order succeeded: the used marker, set
-- for a short lease by redeem, now outlives every pass of the position.
-- KEYS[1]: the position's used marker
-- ARGV[1]: the claim set by the redemption
-- ARGV[2]: the marker's final lifetime (ms)
-- Returns 1 committed, 0 another redemption holds the marker.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not held then
  -- The lease lapsed before the order was done and nobody redeemed the
  -- position since: the order stands, so the pass is spent after all.
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
