-- GCRA charge: one integer per user, the theoretical arrival time (TAT), in
-- microseconds of the Redis server's clock (one clock for every gateway).
-- Each call is a request a replica already let through, so it is always
-- charged: one over the quota leaves a debt that the user's next requests
-- wait out, and over any long span the user gets the policy's rate.
-- KEYS[1]: the user's TAT key
-- ARGV[1]: emission interval T (µs) = 1 s / rate
-- ARGV[2]: burst (requests allowed at once)
-- Returns {within (1|0), remaining, wait µs}: whether the request was within
-- the quota, the requests left now, and how long until the quota admits one.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
-- Within the quota when the new TAT stays within burst × T of now: that is
-- "t > TAT, or TAT - t <= tau" with tau = (burst - 1) × T.
local excess = new_tat - now - burst * interval
if excess > 0 then
  return {0, 0, excess + interval}
end
-- The next request is within once TAT' + T - t <= burst × T.
local wait = excess + interval
if wait < 0 then
  wait = 0
end
return {1, math.floor(-excess / interval), wait}
