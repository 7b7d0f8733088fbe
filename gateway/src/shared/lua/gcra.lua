-- GCRA for one tenant, on Redis's clock (one clock for every gateway).
-- KEYS[1]: the tenant's theoretical arrival time, in microseconds.
-- ARGV[1]: the emission interval (microseconds per request); ARGV[2]: the burst.
-- Returns {1, 0} when admitted, {0, microseconds until one would be}.
local function gcra(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local period = tonumber(ARGV[1])
  local burst = tonumber(ARGV[2])
  local tat = tonumber(redis.call('GET', KEYS[1])) or now
  if tat < now then
    tat = now
  end
  local new_tat = tat + period
  local allow_at = new_tat - burst * period
  if allow_at > now then
    return {0, allow_at - now}
  end
  -- Lua numbers print with 14 digits: format the microseconds whole.
  redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX',
    math.floor((new_tat - now) / 1000) + 1000)
  return {1, 0}
end
