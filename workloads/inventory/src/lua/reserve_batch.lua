-- Reserve when the SKU's only shard lives in the sale's slot: one script for
-- a batch of requests of one SKU, each decided in order exactly as a call of
-- its own would decide it (a single request is a batch of one). Every key is
-- in the sale's slot, so a batch is one atomic step on one node. A granted
-- request's `created` order event goes into the sale's outbox in the same
-- step: a reserved unit and its order's event exist together or not at all,
-- so the order is acknowledged once this script (and, under the replicated
-- policy, the fence round that confirms it) returned, and the outbox relay
-- publishes it.
-- KEYS: 1 sku hash, 2 expiry zset, 3 shard avail, 4 shard held, 5 outbox
--       stream, then per request: user counter, request-id key, reservation
--       hash, taken marker
-- ARGV: 1 sku, then per request: qty, reservation id, user, ttl ms, amount,
--       request id
-- Answers one reply per request, in order: admit's refusal, {'sold_out', ''}
-- or {'reserved', id, expires_at}.
-- (admit.lua runs first.)
local sku = ARGV[1]
local n = (#KEYS - 5) / 4
if n < 1 or n ~= math.floor(n) or #ARGV ~= 1 + 6 * n then
  return redis.error_reply('reserve batch: ' .. #KEYS .. ' keys do not fit ' .. #ARGV .. ' arguments')
end
-- The shard's counters change only here in this script, so they are read
-- once and written once; the requests see them as one by one calls would.
local avail = tonumber(redis.call('GET', KEYS[3]) or '0')
local taken = 0
local now
local replies = {}
for i = 1, n do
  local k = 5 + 4 * (i - 1)
  local a = 1 + 6 * (i - 1)
  local id = ARGV[a + 2]
  local refusal, qty, request = admit(KEYS[1], KEYS[k + 1], KEYS[k + 2], ARGV[a + 1], id, sku)
  if refusal then
    replies[i] = refusal
  elseif avail < qty then
    replies[i] = {'sold_out', ''}
  else
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local expires = now + tonumber(ARGV[a + 4])
    avail = avail - qty
    taken = taken + qty
    redis.call('SET', KEYS[k + 4], qty)
    redis.call('INCRBY', KEYS[k + 1], qty)
    redis.call('HSET', KEYS[k + 3], 'sku', sku, 'user', ARGV[a + 3], 'qty', qty, 'shard', 0,
      'state', 'reserved', 'expires_at', expires, 'request', ARGV[a + 6], 'amount', ARGV[a + 5])
    redis.call('ZADD', KEYS[2], expires, id)
    redis.call('SET', KEYS[k + 2], request)
    redis.call('XADD', KEYS[5], '*', 'kind', 'created', 'reservation', id)
    replies[i] = {'reserved', id, tostring(expires)}
  end
end
if taken > 0 then
  redis.call('DECRBY', KEYS[3], taken)
  redis.call('INCRBY', KEYS[4], taken)
end
return replies
