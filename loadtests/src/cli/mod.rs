//! The subcommands, each a thin layer of flags over the library.

/// `println!` for the tables and JSON on stdout, without its panic when the reader has gone
/// (`sluice-load … | head`): the run goes on to its end, its files written, and only the echo
/// stops ([`print_line`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::print_line(format_args!($($arg)*))
    };
}

pub mod bench;
pub mod calibrate;
pub mod common;
pub mod matrix;
pub mod run;

/// Writes `line` and a newline to stdout; a reader that has gone is not an error.
pub fn print_line(line: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    use std::io::Write as _;
    match writeln!(std::io::stdout(), "{line}") {
        Err(e) if sluice_engine::error::is_closed_stdout(&e) => Ok(()),
        written => written,
    }
}
