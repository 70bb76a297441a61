-- Create a SKU's record if missing; never reset the counts of a SKU already
-- loaded (a reload or a restart must not resell what was sold). The shards'
-- available units are created by the caller with SET NX, each in its slot.
-- KEYS: 1 sku hash
-- ARGV: 1 stock, 2 per-user limit, 3 shards
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'limit', ARGV[2])
  return 0
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'limit', ARGV[2], 'shards', ARGV[3], 'sold', 0)
return 1
