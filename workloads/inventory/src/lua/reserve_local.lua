-- Reserve when the SKU's only shard lives in the sale's slot: one round trip.
-- KEYS: 1 sku hash, 2 user counter, 3 request-id key, 4 reservation hash,
--       5 expiry zset, 6 shard avail, 7 shard held, 8 taken marker
-- ARGV: 1 qty, 2 reservation id, 3 user, 4 sku, 5 ttl ms, 6 amount, 7 request id
-- (admit.lua runs first.)
local avail = tonumber(redis.call('GET', KEYS[6]) or '0')
if avail < qty then
  return {'sold_out', ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = now + tonumber(ARGV[5])
redis.call('DECRBY', KEYS[6], qty)
redis.call('INCRBY', KEYS[7], qty)
redis.call('SET', KEYS[8], qty)
redis.call('INCRBY', KEYS[2], qty)
redis.call('HSET', KEYS[4], 'sku', ARGV[4], 'user', ARGV[3], 'qty', qty, 'shard', 0,
  'state', 'reserved', 'expires_at', expires, 'request', ARGV[7], 'amount', ARGV[6])
redis.call('ZADD', KEYS[5], expires, ARGV[2])
redis.call('SET', KEYS[3], request)
return {'reserved', ARGV[2], tostring(expires)}
