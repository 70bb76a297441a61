-- Admission, shared by reserve_batch.lua and claim.lua (prepended to each):
-- a known request id answers with its reservation, or with 'mismatch' when
-- the request asks for another SKU or quantity than the one that made it; an
-- unknown SKU or a user at the limit is refused. The request-id key holds
-- "<reservation id> <sku> <qty>" (a space is outside the id alphabet) and
-- lives as long as the reservation record: a request id is never forgotten
-- while its reservation exists, so a late retry cannot take stock twice.
-- Answers the refusal, or nil, the quantity as a number and the value the
-- request-id key gets once the request is granted.
local function admit(sku_key, user_key, request_key, qty_arg, id, sku)
  local existing = redis.call('GET', request_key)
  if existing then
    local known, known_sku, known_qty = string.match(existing, '^(%S+) (%S+) (%S+)$')
    if not known then
      return {'corrupt', existing}
    end
    if known_sku ~= sku or known_qty ~= qty_arg then
      return {'mismatch', known}
    end
    -- Rewritten unchanged so this call replicates a write: a WAIT on the
    -- caller's connection then covers the original reservation too, even
    -- when another connection (another replica) made it.
    redis.call('SET', request_key, existing, 'KEEPTTL')
    return {'duplicate', known}
  end
  local request = id .. ' ' .. sku .. ' ' .. qty_arg
  local limit = tonumber(redis.call('HGET', sku_key, 'limit'))
  if not limit then
    return {'unknown_sku', ''}
  end
  local qty = tonumber(qty_arg)
  local held = tonumber(redis.call('GET', user_key) or '0')
  if held + qty > limit then
    return {'user_limit', tostring(held)}
  end
  return nil, qty, request
end
