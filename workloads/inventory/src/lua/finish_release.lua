-- Finish a release after the shard gave the units back: the user's count
-- drops and the reservation leaves the expiry queue. A reservation that
-- lapsed unpaid is put in the outbox in the same step, so its `expired`
-- order event is published at least once whatever crashes. Idempotent.
-- KEYS: 1 reservation hash, 2 expiry zset, 3 user counter, 4 outbox stream
-- ARGV: 1 reservation id
if redis.call('HGET', KEYS[1], 'state') ~= 'releasing' then
  return 0
end
redis.call('DECRBY', KEYS[3], tonumber(redis.call('HGET', KEYS[1], 'qty')))
redis.call('HSET', KEYS[1], 'state', 'released')
redis.call('ZREM', KEYS[2], ARGV[1])
local why = redis.call('HMGET', KEYS[1], 'reason', 'prior')
if why[1] == 'expired' and why[2] == 'reserved' then
  redis.call('XADD', KEYS[4], '*', 'reservation', ARGV[1])
end
return 1
