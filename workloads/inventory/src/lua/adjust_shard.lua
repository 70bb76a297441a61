-- Move a shard's available units by an explicit stock adjustment. A
-- decrease never takes more than is available (reserved and sold units stay).
-- KEYS: 1 shard avail
-- ARGV: 1 delta (may be negative)
local delta = tonumber(ARGV[1])
local avail = tonumber(redis.call('GET', KEYS[1]) or '0')
if avail + delta < 0 then
  return {'short', avail}
end
return {'ok', redis.call('INCRBY', KEYS[1], delta)}
