-- GCRA for Redis, the baseline quorate is measured against: the same answers as redis-cell's
-- CL.THROTTLE (limited, limit, remaining, retry_after s, reset_after s).
-- KEYS[1] = key; ARGV = max_burst, count, period (s), quantity
local burst = tonumber(ARGV[1]) + 1
local interval = tonumber(ARGV[3]) * 1000000 / tonumber(ARGV[2]) -- microseconds
local qty = tonumber(ARGV[4] or "1")
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local dvt = interval * burst
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + interval * qty
local diff = now - (new_tat - dvt)
local limited, retry, ttl
if diff < 0 then
  limited, ttl = 1, tat - now
  retry = (interval * qty <= dvt) and math.ceil(-diff / 1000000) or -1
else
  limited, retry, ttl = 0, -1, new_tat - now
  redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.max(1, math.ceil(ttl / 1000)))
end
local remaining = math.max(0, math.floor((dvt - ttl) / interval))
return {limited, burst, remaining, retry, math.ceil(ttl / 1000000)}
