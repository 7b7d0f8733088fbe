//! The subcommands, each a thin layer of flags over the library.

pub mod bench;
pub mod calibrate;
pub mod common;
pub mod matrix;
pub mod run;
