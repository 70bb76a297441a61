-- Gives a redeemed pass back: deletes the used marker only if it still holds
-- this redemption's claim, so a stale or repeated give-back cannot reopen a
-- later redemption.
-- KEYS[1]: the position's used marker
-- ARGV[1]: the claim set by the redemption
-- Returns 1 given back, 0 not (no longer) held by that claim.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
