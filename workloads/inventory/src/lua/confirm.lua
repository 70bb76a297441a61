-- Payment arrived: reserved -> confirmed, unless the reservation expired
-- (even if no sweeper has returned it yet).
-- KEYS: 1 reservation hash, 2 expiry zset, 3 sku hash
-- ARGV: 1 reservation id
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return 'missing'
end
if state ~= 'reserved' then
  return state
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(redis.call('HGET', KEYS[1], 'expires_at')) then
  return 'expired'
end
redis.call('HSET', KEYS[1], 'state', 'confirmed')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[3], 'sold', tonumber(redis.call('HGET', KEYS[1], 'qty')))
return 'confirmed'
