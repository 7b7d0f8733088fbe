//! A place in line for the requests told to come back: each refusal's `Retry-After` is no
//! sooner than the work of those told before it would be through, so that a burst refused
//! together is told to return one after another, not all at the moment the first would fit.
//! `deadline_unmeetable` keeps one line (each holds it for its prefill), a full queue's
//! `overloaded` another (each holds it for one departure).

use std::time::Duration;

use tokio::time::Instant;

/// When the work of the requests told to come back so far would be through.
#[derive(Debug)]
pub(super) struct ReturnLine {
    until: Instant,
}

impl ReturnLine {
    pub fn new() -> Self {
        Self {
            until: Instant::now(),
        }
    }

    /// The wait to tell a request that would fit `wait` from now: no sooner than the line ahead
    /// is through (the line counted at most `longest` from now), after which it holds the line
    /// for `holds`. A request that never comes back holds its place only that long. Also
    /// whether the line ahead was longer than `longest`: then the wait told is a cap, not a
    /// prediction.
    pub fn place(
        &mut self,
        wait: Duration,
        holds: Duration,
        longest: Duration,
    ) -> (Duration, bool) {
        let now = Instant::now();
        let full = self.until > now + longest && wait < longest;
        let back = (now + wait).max(self.until.min(now + longest));
        self.until = back + holds;
        (back - now, full)
    }
}
