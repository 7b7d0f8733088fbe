-- A token budget over a sliding window, on Redis's clock.
-- KEYS[1]: charges (zset: charge id -> time in ms); KEYS[2]: tokens (hash: charge id -> tokens);
-- KEYS[3]: the sum of the tokens of the charges in the window.
-- ARGV[1]: this charge's id; ARGV[2]: the budget; ARGV[3]: tokens needed; ARGV[4]: window (ms).
-- Returns {1, 0} when charged, {0, milliseconds until enough of it leaves the window}.
-- The three keys live and expire together (two windows after the last call, charged or
-- refused): a sum left over by charges that expired without it would refuse the tenant forever.
local function budget_charge(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local window = tonumber(ARGV[4])
  local cutoff = now - window
  local used = tonumber(redis.call('GET', KEYS[3]))
  if not used then
    -- The sum is gone (evicted): recounted from the charges' tokens.
    used = 0
    for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
      used = used + (tonumber(v) or 0)
    end
  end
  while true do
    local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, 500)
    if #old == 0 then
      break
    end
    local tokens = redis.call('HMGET', KEYS[2], unpack(old))
    for _, v in ipairs(tokens) do
      used = used - (tonumber(v) or 0)
    end
    redis.call('HDEL', KEYS[2], unpack(old))
    redis.call('ZREM', KEYS[1], unpack(old))
  end
  if redis.call('ZCARD', KEYS[1]) == 0 then
    -- No charge in the window (none left at all): nothing is used, whatever the sum said.
    used = 0
    redis.call('DEL', KEYS[2])
  elseif used < 0 then
    used = 0
  end
  local budget = tonumber(ARGV[2])
  local needed = tonumber(ARGV[3])
  local keep = window * 2
  if used + needed > budget then
    -- When enough of the oldest charges leave the window (a full window when the first thousand
    -- are not enough, or the request is larger than the whole budget).
    local at = now + window
    local freed = 0
    local first = redis.call('ZRANGE', KEYS[1], 0, 999, 'WITHSCORES')
    for i = 1, #first, 2 do
      freed = freed + (tonumber(redis.call('HGET', KEYS[2], first[i])) or 0)
      if used - freed + needed <= budget then
        at = tonumber(first[i + 1]) + window
        break
      end
    end
    redis.call('SET', KEYS[3], string.format('%.0f', used), 'PX', keep)
    redis.call('PEXPIRE', KEYS[1], keep)
    redis.call('PEXPIRE', KEYS[2], keep)
    return {0, at - now}
  end
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], needed)
  redis.call('SET', KEYS[3], string.format('%.0f', used + needed), 'PX', keep)
  redis.call('PEXPIRE', KEYS[1], keep)
  redis.call('PEXPIRE', KEYS[2], keep)
  return {1, 0}
end
