-- Lowers a charge to what the request really used (never raises it).
-- KEYS: as budget_charge.lua. ARGV[1]: the charge's id; ARGV[2]: tokens used.
-- Returns the tokens given back.
local function budget_settle(KEYS, ARGV)
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
  if not cur then
    return 0
  end
  local new = tonumber(ARGV[2])
  if new >= cur then
    return 0
  end
  redis.call('HSET', KEYS[2], ARGV[1], new)
  local used = tonumber(redis.call('GET', KEYS[3]))
  if used then
    local left = math.max(used - (cur - new), 0)
    redis.call('SET', KEYS[3], string.format('%.0f', left), 'KEEPTTL')
  end
  return cur - new
end
