-- One slot of the upstream's shared ceiling, as a lease, on Redis's clock.
-- KEYS[1]: leases (zset: lease id -> expiry in ms); KEYS[2]: interactive requests waiting on
-- any gateway (zset: lease id -> expiry in ms).
-- ARGV[1]: lease id; ARGV[2]: "interactive" or "batch"; ARGV[3]: the ceiling; ARGV[4]: TTL (ms);
-- ARGV[5]: "wait" to register a refused interactive request as waiting, "try" not to.
-- The class rules of one gateway's queue, across all of them: batch never takes the last slot
-- (with a ceiling of 1, only while nobody waits), and never while an interactive request waits.
-- Returns {1, active} when granted, {0, active} when not.
local function ceiling_acquire(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  local active = redis.call('ZCARD', KEYS[1])
  local max = tonumber(ARGV[3])
  local ttl = tonumber(ARGV[4])
  local interactive = ARGV[2] == 'interactive'
  local ok
  if interactive then
    ok = active < max
  else
    local waiting = redis.call('ZCARD', KEYS[2])
    if max == 1 then
      ok = active == 0 and waiting == 0
    else
      ok = active + 1 < max and waiting == 0
    end
  end
  if ok then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('PEXPIRE', KEYS[1], ttl * 2)
    return {1, active + 1}
  end
  if interactive and ARGV[5] ~= 'try' then
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
    redis.call('PEXPIRE', KEYS[2], ttl * 2)
  end
  return {0, active}
end
