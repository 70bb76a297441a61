-- Gives a user a queue position, or the one they already hold (after
-- challenge.lua's `spend`).
-- KEYS[1]: the user's hash (`position`, `issued_ms`)
-- KEYS[2]: the position counter
-- KEYS[3]: the frontier hash (`admitted`, `last_us`)
-- KEYS[4]: with a join challenge, its spent marker
-- ARGV[1]: ticket lifetime (ms, >= 1): the user's hash lives as long as the
--          ticket, so a rejoin returns the same ticket or a new place
-- ARGV[2]: with KEYS[4], the challenge's expiry (Unix ms, Redis clock)
-- Returns {position, issued_ms, admitted}; {-1, 0, 0} when the challenge
-- was spent already and {-2, 0, 0} when it has expired, both before any
-- write. A user who holds a place gets it back and spends no challenge.
local admitted = tonumber(redis.call('HGET', KEYS[3], 'admitted')) or 0
local mine = redis.call('HMGET', KEYS[1], 'position', 'issued_ms')
if mine[1] then
  return {tonumber(mine[1]), tonumber(mine[2]), admitted}
end
local now = now_us()
if KEYS[4] then
  local spent = spend(KEYS[4], ARGV[2], math.floor(now / 1000), '')
  if spent < 0 then
    return {spent, 0, 0}
  end
end
local issued = tonumber(redis.call('GET', KEYS[2])) or 0
if admitted >= issued then
  -- The queue was empty: admission credit accrues from now on, not from
  -- the last time the frontier moved.
  redis.call('HSET', KEYS[3], 'admitted', string.format('%.0f', admitted),
    'last_us', string.format('%.0f', now))
end
local position = redis.call('INCR', KEYS[2])
local issued_ms = math.floor(now / 1000)
redis.call('HSET', KEYS[1], 'position', position,
  'issued_ms', string.format('%.0f', issued_ms))
-- Gone by the ticket's last valid millisecond (Redis keeps a key through
-- its expiry time), so a rejoin never returns an expired ticket.
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', issued_ms + tonumber(ARGV[1]) - 1))
return {position, issued_ms, admitted}
