//! The Lua scripts, loaded once per process (`EVALSHA`, `EVAL` when Redis lost them).

use std::sync::LazyLock;

use redis::Script;

pub static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/gcra.lua")));
pub static BUDGET_CHARGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/budget_charge.lua")));
pub static BUDGET_SETTLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/budget_settle.lua")));
pub static CEILING_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/ceiling_acquire.lua")));
pub static CEILING_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/ceiling_renew.lua")));
pub static CEILING_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/ceiling_release.lua")));
