-- Gives a lease back and tells the waiting gateways.
-- KEYS[1]: leases; KEYS[2]: interactive waiters. ARGV[1]: lease id; ARGV[2]: the channel.
local gone = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if gone > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[1])
end
return gone
