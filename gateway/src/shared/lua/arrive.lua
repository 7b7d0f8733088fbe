-- On arrival, in one call: the token budget's charge, then (when the local slot is free) a try
-- at a lease of the shared ceiling, never registered as waiting (the layer after the local
-- slot waits for one if this try is refused).
-- KEYS[1..3]: budget_charge's; KEYS[4..5]: ceiling_acquire's.
-- ARGV[1..4]: budget_charge's; ARGV[5..8]: ceiling_acquire's first four.
-- Returns {1, 0, leased (1 or 0)} when charged, {0, milliseconds to wait, 0} when not.
local c = budget_charge({KEYS[1], KEYS[2], KEYS[3]}, {ARGV[1], ARGV[2], ARGV[3], ARGV[4]})
if c[1] == 0 or #KEYS < 5 then
  return {c[1], c[2], 0}
end
local l = ceiling_acquire({KEYS[4], KEYS[5]}, {ARGV[5], ARGV[6], ARGV[7], ARGV[8], 'try'})
return {1, 0, l[1]}
