//! An engine's own saturation signals, read from its Prometheus `/metrics`: how many requests
//! it is running and holding in its own queue, and how full its KV cache is. vLLM, SGLang,
//! llama.cpp's `llama-server` (with `--metrics`) and the bundled engine (which uses vLLM's
//! names) are understood; several series of one metric (per model, per rank) are summed, or for
//! KV use, the fullest one is taken.

/// What one scrape said.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signals {
    pub running: Option<f64>,
    /// Requests waiting inside the engine (not yet scheduled).
    pub waiting: Option<f64>,
    /// KV cache use, 0..=1.
    pub kv_usage: Option<f64>,
}

impl Signals {
    /// Whether the exposition named any metric this understands.
    pub fn is_empty(&self) -> bool {
        self.running.is_none() && self.waiting.is_none() && self.kv_usage.is_none()
    }
}

const RUNNING: &[&str] = &[
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "llamacpp:requests_processing",
];
const WAITING: &[&str] = &[
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "llamacpp:requests_deferred",
];
/// vLLM renamed `gpu_cache_usage_perc` to `kv_cache_usage_perc`; both are fractions.
const KV_USAGE: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
];

/// Reads the signals out of a Prometheus text exposition.
pub fn parse(text: &str) -> Signals {
    let mut s = Signals::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = sample(line) else {
            continue;
        };
        if RUNNING.contains(&name) {
            *s.running.get_or_insert(0.0) += value;
        } else if WAITING.contains(&name) {
            *s.waiting.get_or_insert(0.0) += value;
        } else if KV_USAGE.contains(&name) {
            let kv = s.kv_usage.get_or_insert(0.0);
            *kv = kv.max(value);
        }
    }
    s
}

/// A sample line's metric name and value (`name{labels} value [timestamp]`).
fn sample(line: &str) -> Option<(&str, f64)> {
    let name_end = line.find(['{', ' ', '\t'])?;
    let name = &line[..name_end];
    let rest = &line[name_end..];
    let rest = match rest.strip_prefix('{') {
        // Label values may hold spaces and braces inside quotes: skip to the closing brace
        // outside any quoted string.
        Some(labels) => {
            let mut in_quotes = false;
            let mut escaped = false;
            let mut close = None;
            for (i, c) in labels.char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => in_quotes = !in_quotes,
                    '}' if !in_quotes => {
                        close = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            &labels[close? + 1..]
        }
        None => rest,
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    value.is_finite().then_some((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm() {
        let text = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-70B"} 4.0
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-70B"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-70B"} 0.83
vllm:prompt_tokens_total{model_name="x"} 1234
"#;
        assert_eq!(
            parse(text),
            Signals {
                running: Some(4.0),
                waiting: Some(7.0),
                kv_usage: Some(0.83)
            }
        );
    }

    #[test]
    fn reads_sglang_and_sums_series() {
        let text = "sglang:num_running_reqs{model_name=\"m\",tp_rank=\"0\"} 2\n\
                    sglang:num_running_reqs{model_name=\"m\",tp_rank=\"1\"} 3\n\
                    sglang:num_queue_reqs{model_name=\"m\"} 5\n\
                    sglang:token_usage{model_name=\"m\",tp_rank=\"0\"} 0.4\n\
                    sglang:token_usage{model_name=\"m\",tp_rank=\"1\"} 0.9\n";
        let s = parse(text);
        assert_eq!(
            (s.running, s.waiting, s.kv_usage),
            (Some(5.0), Some(5.0), Some(0.9))
        );
    }

    #[test]
    fn reads_llama_server_and_old_vllm_names() {
        let s = parse("llamacpp:requests_processing 1\nllamacpp:requests_deferred 2\nllamacpp:kv_cache_usage_ratio 0.25\n");
        assert_eq!(
            (s.running, s.waiting, s.kv_usage),
            (Some(1.0), Some(2.0), Some(0.25))
        );
        assert_eq!(
            parse("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5 1700000000000").kv_usage,
            Some(0.5)
        );
    }

    #[test]
    fn labels_with_braces_and_spaces_and_junk_lines() {
        let text = "vllm:num_requests_waiting{model_name=\"a } b\",x=\"\\\"q\\\"\"} 3\n\
                    garbage line\n\
                    vllm:num_requests_running{unterminated=\"x} 9\n\
                    vllm:num_requests_running NaN\n";
        let s = parse(text);
        assert_eq!((s.waiting, s.running), (Some(3.0), None));
        assert!(parse("# only comments\n").is_empty());
    }
}
