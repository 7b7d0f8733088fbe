-- Renews (or adopts: a request admitted while Redis was away) this gateway's leases.
-- KEYS[1]: leases. ARGV[1]: TTL (ms); ARGV[2..]: lease ids. Returns the leases active now.
local function ceiling_renew(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ttl = tonumber(ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  for i = 2, #ARGV do
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  end
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
  return redis.call('ZCARD', KEYS[1])
end
