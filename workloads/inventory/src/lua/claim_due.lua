-- The sweeper's share of due work: up to ARGV[1] reservation ids whose time
-- has passed, each pushed ARGV[2] ms into the future so that other replicas
-- sweeping at the same moment take other ids. A sweeper that dies holding
-- ids leaves them due again once that lease passes; a finished release
-- removes its id (finish_release.lua).
-- KEYS: 1 expiry zset
-- ARGV: 1 batch, 2 lease ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local lease = now + tonumber(ARGV[2])
for _, id in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', lease, id)
end
return due
