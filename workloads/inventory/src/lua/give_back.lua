-- Return the units a shard gave to a reservation, once: the marker is the
-- proof they were taken, and deleting it makes a second call a no-op.
-- KEYS: 1 shard avail, 2 shard held, 3 taken marker
local qty = tonumber(redis.call('GET', KEYS[3]) or '0')
if qty > 0 then
  redis.call('DEL', KEYS[3])
  redis.call('INCRBY', KEYS[1], qty)
  redis.call('DECRBY', KEYS[2], qty)
end
return qty
