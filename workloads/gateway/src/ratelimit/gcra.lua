-- GCRA: one integer per user, the theoretical arrival time (TAT), in
-- microseconds of the Redis server's clock (one clock for every gateway).
-- KEYS[1]: the user's TAT key
-- ARGV[1]: emission interval T (µs) = 1 s / rate
-- ARGV[2]: burst (requests allowed at once)
-- Returns {allowed (1|0), remaining, retry_after µs, reset µs}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new_tat = tat + interval
-- Allowed when the new TAT stays within burst × T of now: that is
-- "t > TAT, or TAT - t <= tau" with tau = (burst - 1) × T.
local excess = new_tat - now - burst * interval
if excess > 0 then
  return {0, 0, excess, tat - now}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
return {1, math.floor(-excess / interval), 0, new_tat - now}
