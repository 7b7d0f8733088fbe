//! Needle in a haystack: a code sentence hidden at a given depth of a long document, then the
//! question. The answer passes when it contains the code. A small model may score poorly;
//! that is the measurement.

use std::sync::Arc;

use super::{Check, Job, JobSource};
use crate::client::Api;
use crate::error::Result;
use crate::prompts::PromptSource;
use crate::request;
use crate::rng::Rng;

/// Tokens kept free in the haystack for the needle, the question and the chat template.
const ALLOWANCE: usize = 64;
const WORDS: &[&str] = &[
    "mango", "cobalt", "falcon", "juniper", "quartz", "saffron", "tundra", "walnut",
];

/// Needle requests over `haystack`-token documents, cycling through `depths` (0 = the start,
/// 1 = the end).
#[derive(Clone)]
pub struct NeedleJobs {
    pub prompts: Arc<dyn PromptSource>,
    pub model: String,
    pub haystack: usize,
    pub depths: Vec<f64>,
    pub base: u64,
    pub seed: u64,
}

impl std::fmt::Debug for NeedleJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NeedleJobs({} tokens at {:?})",
            self.haystack, self.depths
        )
    }
}

/// The code hidden in request `n`: a word and a number, unlikely to be guessed.
fn code(seed: u64, n: u64) -> String {
    let mut rng = Rng::new(seed, n);
    format!("{}-{}", rng.pick(WORDS), 1000 + rng.below(9000))
}

/// `text` with `needle` put in at the sentence boundary nearest `depth` of its length.
pub(crate) fn insert_at_depth(text: &str, needle: &str, depth: f64) -> String {
    let target = (text.len() as f64 * depth.clamp(0.0, 1.0)) as usize;
    let at = text
        .match_indices(". ")
        .map(|(i, _)| i + 2)
        .min_by_key(|&i| i.abs_diff(target))
        .filter(|_| target > 0 && target < text.len())
        .unwrap_or(if target == 0 { 0 } else { text.len() });
    let (head, tail) = text.split_at(at);
    let sep = if head.is_empty() || head.ends_with(' ') {
        ""
    } else {
        " "
    };
    format!("{head}{sep}{needle} {tail}")
}

impl NeedleJobs {
    fn depth(&self, n: u64) -> f64 {
        self.depths[n as usize % self.depths.len()]
    }
}

impl JobSource for NeedleJobs {
    fn job(&self, n: u64) -> Result<Job> {
        let depth = self.depth(n);
        let code = code(self.seed, n);
        let needle = format!("The secret code for the archive is {code}.");
        let hay = self.prompts.prompt(
            self.haystack.saturating_sub(ALLOWANCE).max(1),
            self.base + n,
        )?;
        let user = format!(
            "{}\n\nWhat is the secret code for the archive? Answer with the code only.",
            insert_at_depth(&hay, &needle, depth)
        );
        Ok(Job {
            api: Api::Chat,
            body: request::chat(&self.model, &user, 32, serde_json::json!({})),
            check: Check::Contains(code),
            kind: format!("needle@{:.0}%", depth * 100.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needles_go_in_at_sentence_boundaries() {
        let text = "One. Two. Three. Four.";
        assert_eq!(
            insert_at_depth(text, "N.", 0.0),
            "N. One. Two. Three. Four."
        );
        assert_eq!(
            insert_at_depth(text, "N.", 1.0),
            "One. Two. Three. Four. N. "
        );
        assert_eq!(
            insert_at_depth(text, "N.", 0.5),
            "One. Two. N. Three. Four."
        );
        assert_eq!(insert_at_depth("no stops", "N.", 0.5), "no stops N. ");
    }

    struct Filler;
    impl PromptSource for Filler {
        fn prompt(&self, tokens: usize, _: u64) -> Result<String> {
            Ok("Filler sentence. ".repeat(tokens / 3))
        }
    }

    #[test]
    fn each_request_hides_its_own_code_at_its_depth() {
        let jobs = NeedleJobs {
            prompts: Arc::new(Filler),
            model: "m".into(),
            haystack: 400,
            depths: vec![0.1, 0.9],
            base: 0,
            seed: 3,
        };
        let (a, b) = (jobs.job(0).unwrap(), jobs.job(1).unwrap());
        let (Check::Contains(ca), Check::Contains(cb)) = (&a.check, &b.check) else {
            panic!("needle jobs are scored by their code")
        };
        assert_ne!(ca, cb);
        assert_eq!(
            (a.kind.as_str(), b.kind.as_str()),
            ("needle@10%", "needle@90%")
        );
        let body: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        let user = body["messages"][0]["content"].as_str().unwrap();
        let at = user.find(ca.as_str()).unwrap() as f64 / user.len() as f64;
        assert!((0.05..0.2).contains(&at), "{at}");
        assert!(user.ends_with("Answer with the code only."));
    }
}
