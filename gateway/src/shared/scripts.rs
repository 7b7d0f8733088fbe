//! The Lua scripts, loaded once per process (`EVALSHA`, `EVAL` when Redis lost them).
//!
//! Each file under `lua/` defines one local function (`gcra`, `budget_charge`, ...); a script is
//! the functions it needs and a short body that calls them, so the combined scripts a request uses on
//! arrival (`arrive`: rate + charge + lease) and at its end (`finish`: settle + release) run the
//! same code as the single ones, in one round trip.

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation, ToRedisArgs};

const GCRA_FN: &str = include_str!("lua/gcra.lua");
const BUDGET_CHARGE_FN: &str = include_str!("lua/budget_charge.lua");
const BUDGET_SETTLE_FN: &str = include_str!("lua/budget_settle.lua");
const CEILING_ACQUIRE_FN: &str = include_str!("lua/ceiling_acquire.lua");
const CEILING_RENEW_FN: &str = include_str!("lua/ceiling_renew.lua");
const CEILING_RELEASE_FN: &str = include_str!("lua/ceiling_release.lua");

/// `script` over `keys`, in order (its arguments follow with `.arg`).
pub fn over<K: ToRedisArgs>(
    script: &Script,
    keys: impl IntoIterator<Item = K>,
) -> ScriptInvocation<'_> {
    let mut call = script.prepare_invoke();
    for k in keys {
        call.key(k);
    }
    call
}

/// The functions, then the script's body.
fn script(functions: &[&str], body: &str) -> Script {
    let mut code = functions.join("\n");
    code.push('\n');
    code.push_str(body);
    Script::new(&code)
}

/// A script that calls one function with its keys and arguments.
fn single(function: &str, name: &str) -> Script {
    script(&[function], &format!("return {name}(KEYS, ARGV)\n"))
}

pub static BUDGET_SETTLE: LazyLock<Script> =
    LazyLock::new(|| single(BUDGET_SETTLE_FN, "budget_settle"));
pub static CEILING_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| single(CEILING_ACQUIRE_FN, "ceiling_acquire"));
pub static CEILING_RENEW: LazyLock<Script> =
    LazyLock::new(|| single(CEILING_RENEW_FN, "ceiling_renew"));
pub static CEILING_RELEASE: LazyLock<Script> =
    LazyLock::new(|| single(CEILING_RELEASE_FN, "ceiling_release"));
/// The rate, the charge and a try at a lease, whichever apply (`lua/arrive.lua`).
pub static ARRIVE: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[GCRA_FN, BUDGET_CHARGE_FN, CEILING_ACQUIRE_FN],
        include_str!("lua/arrive.lua"),
    )
});
/// The settle and the release (`lua/finish.lua`).
pub static FINISH: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[BUDGET_SETTLE_FN, CEILING_RELEASE_FN],
        include_str!("lua/finish.lua"),
    )
});
