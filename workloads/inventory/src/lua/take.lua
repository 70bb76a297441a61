-- Step 2 of a sharded reservation (shard slot): take units from one shard
-- and leave a marker, unless the sweeper has fenced this shard for the
-- claim (it released the claim after its window and returned whatever the
-- shard had given). The fence is a marker set by give_back.lua, on this
-- shard's own primary: no clock of another primary is compared, so clock
-- skew or a failover between primaries cannot let a late take leak units.
-- KEYS: 1 shard avail, 2 shard held, 3 taken marker
-- ARGV: 1 qty
local marker = redis.call('GET', KEYS[3])
if marker == 'fenced' then
  return 'late'
end
if marker then
  -- A retried step: the units are already taken for this claim.
  return 'taken'
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
