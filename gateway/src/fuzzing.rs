//! Entry points for the gateway's fuzz targets (`fuzz/`): each must return for any input and
//! never panic. `sluice_engine::fuzzing::regressions` finds the saved inputs that the tests
//! below replay.

use std::sync::OnceLock;

use sluice_engine::server::prompt::Endpoint;

use crate::middleware::cap;
use crate::middleware::count::{PromptCounter, Rendering, TokenCounter};
use crate::policy::{Limits, LoadedPolicy};

/// The real model's tokenizer and chat template, read once; `None` without the model.
fn counter() -> Option<&'static PromptCounter> {
    static COUNTER: OnceLock<Option<PromptCounter>> = OnceLock::new();
    COUNTER
        .get_or_init(|| PromptCounter::open(&sluice_engine::model::default_model_path()).ok())
        .as_ref()
}

/// A request body as the stack handles it: parsed, its prompt counted for both endpoints
/// with the real tokenizer and chat template (as the engine renders it and as an upstream's
/// template does), and `max_tokens` capped.
pub fn request(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Some(counter) = counter() else {
        return;
    };
    for endpoint in [Endpoint::ChatCompletions, Endpoint::Completions] {
        if let Ok(n) = counter.count(endpoint, &value) {
            let _ = cap::apply(&Limits::default(), endpoint, n, &mut value.clone());
        }
        // As a vLLM or SGLang upstream's template renders it (a `tokenizer.json` counter).
        let _ = counter.count_as(Rendering::Template, endpoint, &value);
    }
}

/// A policy file's bytes, parsed and validated.
pub fn policy(data: &[u8]) {
    let _ = LoadedPolicy::from_bytes(data, None);
}

#[cfg(test)]
mod tests {
    use sluice_engine::fuzzing::regressions;

    #[test]
    fn saved_request_and_policy_inputs_still_pass() {
        let requests = regressions("request");
        let policies = regressions("policy");
        assert!(
            !requests.is_empty() && !policies.is_empty(),
            "no saved inputs"
        );
        assert!(super::counter().is_some(), "the model is needed");
        for (path, bytes) in requests {
            eprintln!("{}", path.display());
            super::request(&bytes);
        }
        for (path, bytes) in policies {
            eprintln!("{}", path.display());
            super::policy(&bytes);
        }
    }
}
