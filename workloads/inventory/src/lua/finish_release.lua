-- Finish a release after the shard gave the units back: the user's count
-- drops and the reservation leaves the expiry queue. Idempotent.
-- KEYS: 1 reservation hash, 2 expiry zset, 3 user counter
-- ARGV: 1 reservation id
if redis.call('HGET', KEYS[1], 'state') ~= 'releasing' then
  return 0
end
redis.call('DECRBY', KEYS[3], tonumber(redis.call('HGET', KEYS[1], 'qty')))
redis.call('HSET', KEYS[1], 'state', 'released')
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
