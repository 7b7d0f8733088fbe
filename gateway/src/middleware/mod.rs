//! The gateway's tower layers, one module each, in stack order (see [`crate::app::stack`]).

pub mod admission;
pub mod around;
pub mod auth;
pub mod budget;
pub mod cap;
pub mod check;
pub mod count;
pub mod parse;
pub mod rate_limit;
pub mod request_id;
