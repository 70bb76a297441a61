-- Admission, shared by reserve_local.lua and claim.lua (prepended to each):
-- a known request id answers with its reservation, or with 'mismatch' when
-- the request asks for another SKU or quantity than the one that made it; an
-- unknown SKU or a user at the limit is refused. Leaves `qty` and `request`
-- set for the script that follows. The request-id key holds
-- "<reservation id> <sku> <qty>" (a space is outside the id alphabet) and
-- lives as long as the reservation record: a request id is never forgotten
-- while its reservation exists, so a late retry cannot take stock twice.
-- KEYS: 1 sku hash, 2 user counter, 3 request-id key, (4 reservation hash, 5 expiry zset)
-- ARGV: 1 qty, (2 reservation id, 3 user, 4 sku, 5 ttl or window ms, 6 amount, 7 request id)
local existing = redis.call('GET', KEYS[3])
if existing then
  local id, sku, qty = string.match(existing, '^(%S+) (%S+) (%S+)$')
  if not id then
    return {'corrupt', existing}
  end
  if sku ~= ARGV[4] or qty ~= ARGV[1] then
    return {'mismatch', id}
  end
  return {'duplicate', id}
end
local request = ARGV[2] .. ' ' .. ARGV[4] .. ' ' .. ARGV[1]
local limit = tonumber(redis.call('HGET', KEYS[1], 'limit'))
if not limit then
  return {'unknown_sku', ''}
end
local qty = tonumber(ARGV[1])
local held = tonumber(redis.call('GET', KEYS[2]) or '0')
if held + qty > limit then
  return {'user_limit', tostring(held)}
end
