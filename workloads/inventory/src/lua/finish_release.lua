-- Finish a release after the shard gave the units back: the user's count
-- drops and the reservation leaves the expiry queue. A reservation that was
-- an order (it left state `reserved`) is put in the outbox in the same
-- step, so its `expired` order event is published at least once whatever
-- crashes: one that lapsed unpaid, and one cancelled. Its `created` event
-- entered the same stream earlier, when it was reserved. A claim that never
-- settled was never an order. Idempotent: only the call that leaves
-- `releasing` adds.
-- KEYS: 1 reservation hash, 2 expiry zset, 3 user counter, 4 outbox stream
-- ARGV: 1 reservation id
if redis.call('HGET', KEYS[1], 'state') ~= 'releasing' then
  return 0
end
redis.call('DECRBY', KEYS[3], tonumber(redis.call('HGET', KEYS[1], 'qty')))
redis.call('HSET', KEYS[1], 'state', 'released')
redis.call('ZREM', KEYS[2], ARGV[1])
local why = redis.call('HMGET', KEYS[1], 'reason', 'prior')
if why[2] == 'reserved' and (why[1] == 'expired' or why[1] == 'cancelled') then
  redis.call('XADD', KEYS[4], '*', 'kind', 'expired', 'reservation', ARGV[1])
end
return 1
