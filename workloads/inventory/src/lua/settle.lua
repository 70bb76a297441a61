-- Step 3 of a sharded reservation (sale slot): a pending claim becomes a
-- reservation on the shard that gave the units, or is released as sold out.
-- A reservation's `created` order event goes into the outbox in the same step
-- (see reserve_batch.lua).
-- KEYS: 1 reservation hash, 2 expiry zset, 3 user counter, 4 outbox stream
-- ARGV: 1 reservation id, 2 shard index or -1 when every shard was empty, 3 ttl ms
if redis.call('HGET', KEYS[1], 'state') ~= 'pending' then
  return {redis.call('HGET', KEYS[1], 'state') or 'missing', ''}
end
local shard = tonumber(ARGV[2])
if shard < 0 then
  local qty = tonumber(redis.call('HGET', KEYS[1], 'qty'))
  redis.call('DECRBY', KEYS[3], qty)
  redis.call('HSET', KEYS[1], 'state', 'released', 'reason', 'sold_out')
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {'sold_out', ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'reserved', 'shard', shard, 'expires_at', expires)
redis.call('ZADD', KEYS[2], expires, ARGV[1])
redis.call('XADD', KEYS[4], '*', 'kind', 'created', 'reservation', ARGV[1])
return {'reserved', tostring(expires)}
