-- On arrival, in one call, the parts ARGV[1] names, in its order; each takes its keys and its
-- arguments from the lists in turn:
--   'r': the tenant's GCRA (gcra's 1 key and 2 arguments);
--   'b': the token budget's charge (budget_charge's 3 keys and 4 arguments);
--   'l': a try at a lease of the shared ceiling (ceiling_acquire's 2 keys and first 4
--        arguments), never registered as waiting: the layer after the local slot waits for one
--        if this try is refused.
-- The first part that refuses ends the call; what the parts before it did stays done (a request
-- the budget refuses has taken its place in the rate, as on a single gateway).
-- Returns {0, 0, leased (1 or 0)} when every part passed, {1, microseconds to wait, 0} when the
-- rate refused, {2, milliseconds to wait, 0} when the budget did.
local k, a = 0, 1
local function take(nk, na)
  local keys, args = {}, {}
  for i = 1, nk do
    keys[i] = KEYS[k + i]
  end
  for i = 1, na do
    args[i] = ARGV[a + i]
  end
  k, a = k + nk, a + na
  return keys, args
end
local leased = 0
for i = 1, #ARGV[1] do
  local part = string.sub(ARGV[1], i, i)
  if part == 'r' then
    local r = gcra(take(1, 2))
    if r[1] == 0 then
      return {1, r[2], 0}
    end
  elseif part == 'b' then
    local c = budget_charge(take(3, 4))
    if c[1] == 0 then
      return {2, c[2], 0}
    end
  elseif part == 'l' then
    local keys, args = take(2, 4)
    args[5] = 'try'
    leased = ceiling_acquire(keys, args)[1]
  else
    return redis.error_reply('arrive: unknown part ' .. part)
  end
end
return {0, 0, leased}
