-- Start returning a reservation's units (cancel, expiry, or a pending claim
-- past its deadline). Exactly one caller moves it to 'releasing'; the entry
-- stays in the expiry zset (due now) so a crash before finish is retried.
-- The state it left is kept as `prior`: only a reservation that was an
-- order (not a claim that never settled) announces its expiry.
-- Answers {state, shard, qty, sku, user}.
-- KEYS: 1 reservation hash, 2 expiry zset
-- ARGV: 1 reservation id, 2 reason ('cancelled' or 'expired'), 3 'due' to
--       release only if the reservation's time has passed
local function releasing()
  local r = redis.call('HMGET', KEYS[1], 'shard', 'qty', 'sku', 'user')
  return {'releasing', r[1], r[2], r[3], r[4]}
end
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {'missing'}
end
if state == 'releasing' then
  return releasing()
end
if state ~= 'reserved' and state ~= 'pending' then
  return {state}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[3] == 'due' and now < tonumber(redis.call('HGET', KEYS[1], 'expires_at')) then
  return {'not_due'}
end
if state == 'pending' and now < tonumber(redis.call('HGET', KEYS[1], 'expires_at')) then
  -- A claim still inside its window may yet be settled: only its deadline releases it.
  return {'pending'}
end
redis.call('HSET', KEYS[1], 'state', 'releasing', 'reason', ARGV[2], 'prior', state)
redis.call('ZADD', KEYS[2], now, ARGV[1])
return releasing()
