//! Rules across keys that types alone cannot express.

use super::load::PolicyError;
use super::schema::Policy;

/// Checks `policy` whole; the first broken rule is the error.
pub fn check(p: &Policy) -> Result<(), PolicyError> {
    let fail = |m: String| Err(PolicyError::new(m));
    let (l, a) = (&p.limits, &p.admission);
    if l.input_tokens_max == 0 {
        return fail("limits.input_tokens_max: must be at least 1".into());
    }
    if l.input_tokens_max > l.context_window {
        return fail(format!(
            "limits.input_tokens_max ({}) is larger than limits.context_window ({})",
            l.input_tokens_max, l.context_window
        ));
    }
    if a.active_max == 0 {
        return fail("admission.active_max: must be at least 1".into());
    }
    if a.heavy_active_max > a.active_max {
        return fail(format!(
            "admission.heavy_active_max ({}) is larger than admission.active_max ({})",
            a.heavy_active_max, a.active_max
        ));
    }
    Ok(())
}
