-- Step 2 of a sharded reservation (shard slot): take units from one shard
-- and leave a marker, unless the claim's deadline has passed (then the
-- sweeper may already have settled the claim).
-- KEYS: 1 shard avail, 2 shard held, 3 taken marker
-- ARGV: 1 qty, 2 claim deadline ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(ARGV[2]) then
  return 'late'
end
local qty = tonumber(ARGV[1])
local avail = tonumber(redis.call('GET', KEYS[1]) or '0')
if avail < qty then
  return 'empty'
end
redis.call('DECRBY', KEYS[1], qty)
redis.call('INCRBY', KEYS[2], qty)
redis.call('SET', KEYS[3], qty)
return 'taken'
