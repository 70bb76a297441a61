-- Spends the join challenge of an order placed without a waiting room
-- (after challenge.lua's `spend`).
-- KEYS[1]: the challenge's spent marker
-- ARGV[1]: the challenge's expiry (Unix ms, Redis clock)
-- ARGV[2]: the order's request id
-- Returns 1 when spent (now, or by this order before), -1 when spent by
-- another order, -2 when expired.
return spend(KEYS[1], ARGV[1], math.floor(now_us() / 1000), ARGV[2])
