-- Gives a lease back and, when a refused request may be waiting for it, tells the gateways:
-- when the leases left are within one of the ceiling (where interactive or batch requests are
-- refused) or an interactive request waits. A waiter that no message reaches polls (POLL).
-- KEYS[1]: leases; KEYS[2]: interactive waiters.
-- ARGV[1]: lease id; ARGV[2]: the channel; ARGV[3]: the ceiling the lease was taken under.
local function ceiling_release(KEYS, ARGV)
  local gone = redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  if gone > 0 then
    local full = redis.call('ZCARD', KEYS[1]) + 2 >= tonumber(ARGV[3])
    if full or redis.call('ZCARD', KEYS[2]) > 0 then
      redis.call('PUBLISH', ARGV[2], ARGV[1])
    end
  end
  return gone
end
