-- The durability fence, sent with a WAIT right behind it on a connection of
-- its own: answers, per reservation, 1 if this node holds it and 0 if not,
-- and rewrites one held key unchanged. That write moves the connection's
-- replication offset past everything the node holds, so the WAIT behind it
-- covers the writes that made these keys, whichever connection made them.
-- A reservation this node lacks (a replica promoted before it got it, a
-- Redis restarted empty, another node's write of the same request id) is
-- reported, never vouched for.
-- KEYS: request-id keys of the reservations to acknowledge, in one slot.
-- ARGV: the value each key holds when it stands for that reservation
--       ("<reservation id> <sku> <qty>").
if #ARGV ~= #KEYS then
  return redis.error_reply('fence: ' .. #KEYS .. ' keys and ' .. #ARGV .. ' values')
end
local held = {}
local written = false
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value == ARGV[i] then
    held[i] = 1
    if not written then
      redis.call('SET', KEYS[i], value, 'KEEPTTL')
      written = true
    end
  else
    held[i] = 0
  end
end
return held
