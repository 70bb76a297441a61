-- Admission, shared by reserve_local.lua and claim.lua (prepended to each):
-- a known request id answers with its reservation; an unknown SKU or a user
-- at the limit is refused. Leaves `qty` set for the script that follows.
-- KEYS: 1 sku hash, 2 user counter, 3 request-id key, (4 reservation hash, 5 expiry zset)
-- ARGV: 1 qty, (2 reservation id, 3 user, 4 sku, 5 ttl or window ms, 6 request-id ttl s, 7 request id)
local existing = redis.call('GET', KEYS[3])
if existing then
  return {'duplicate', existing}
end
local limit = tonumber(redis.call('HGET', KEYS[1], 'limit'))
if not limit then
  return {'unknown_sku', ''}
end
local qty = tonumber(ARGV[1])
local held = tonumber(redis.call('GET', KEYS[2]) or '0')
if held + qty > limit then
  return {'user_limit', tostring(held)}
end
