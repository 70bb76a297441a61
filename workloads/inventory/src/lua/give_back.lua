-- Return the units a shard gave to a reservation, once: the marker is the
-- proof they were taken, and removing it makes a second call a no-op.
-- When the release settles a claim that never finished, the marker is
-- replaced by a fence instead, so a late step 2 of that claim on this shard
-- takes nothing (take.lua); the fence expires after ARGV[2] ms.
-- KEYS: 1 shard avail, 2 shard held, 3 taken marker
-- ARGV: 1 'fence' or '', 2 fence lifetime ms
local marker = redis.call('GET', KEYS[3])
local qty = 0
if marker and marker ~= 'fenced' then
  qty = tonumber(marker)
  redis.call('INCRBY', KEYS[1], qty)
  redis.call('DECRBY', KEYS[2], qty)
end
if ARGV[1] == 'fence' then
  redis.call('SET', KEYS[3], 'fenced', 'PX', ARGV[2])
elseif marker then
  redis.call('DEL', KEYS[3])
end
return qty
