-- Step 1 of a sharded reservation (sale slot): idempotency, the per-user
-- limit, and a pending reservation that the sweeper settles if step 3 never comes.
-- KEYS: 1 sku hash, 2 user counter, 3 request-id key, 4 reservation hash, 5 expiry zset
-- ARGV: 1 qty, 2 reservation id, 3 user, 4 sku, 5 claim window ms, 6 amount, 7 request id
-- (admit.lua runs first.)
local refusal, qty, request = admit(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[4])
if refusal then
  return refusal
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[5])
redis.call('INCRBY', KEYS[2], qty)
redis.call('HSET', KEYS[4], 'sku', ARGV[4], 'user', ARGV[3], 'qty', qty, 'shard', -1,
  'state', 'pending', 'expires_at', deadline, 'request', ARGV[7], 'amount', ARGV[6])
redis.call('ZADD', KEYS[5], deadline, ARGV[2])
redis.call('SET', KEYS[3], request)
return {'claimed', ARGV[2], tostring(deadline)}
