-- Create a SKU's record if missing; never reset the counts of a SKU already
-- loaded (a reload or a restart must not resell what was sold). The shards'
-- available units are created by the caller with SET NX, each in its slot.
-- Once the sale has opened nothing is created: a record missing then was
-- lost by Redis (a flush, a restart without persistence, a failover that
-- dropped writes), and recreating it would sell its units again.
-- KEYS: 1 sku hash, 2 the sale's load marker
-- ARGV: 1 stock, 2 per-user limit, 3 shards, 4 the sale's opening (Unix ms, 0: unknown)
-- Answers 1 (created), 0 (found) or -1 (missing after the opening).
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'limit', ARGV[2])
  redis.call('SET', KEYS[2], ARGV[4], 'NX')
  return 0
end
local opens = tonumber(ARGV[4])
if opens > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now >= opens then
    return -1
  end
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'limit', ARGV[2], 'shards', ARGV[3], 'sold', 0)
redis.call('SET', KEYS[2], ARGV[4], 'NX')
return 1
