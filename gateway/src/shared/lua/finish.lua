-- At the end, in one call: the charge settled and the lease given back.
-- KEYS[1..3]: budget_settle's; KEYS[4..5]: ceiling_release's.
-- ARGV[1..2]: budget_settle's; ARGV[3..5]: ceiling_release's. Returns the tokens given back.
local given = budget_settle({KEYS[1], KEYS[2], KEYS[3]}, {ARGV[1], ARGV[2]})
ceiling_release({KEYS[4], KEYS[5]}, {ARGV[3], ARGV[4], ARGV[5]})
return given
