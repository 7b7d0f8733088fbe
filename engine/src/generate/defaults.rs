//! The generation defaults a request gets for the sampling fields it leaves out: the model's
//! own recommendation from its GGUF metadata (`general.sampling.*`, written by llama.cpp's
//! converter) where present, else llama-server's sampler chain; engine flags override either.

use crate::model::gguf::GgufFile;

/// Defaults for `temperature`, `top_k`, `top_p`, `min_p` and `repetition_penalty`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
}

impl Default for GenerationDefaults {
    /// llama-server's: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8, no repetition penalty.
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
        }
    }
}

impl GenerationDefaults {
    /// llama-server's values, replaced by the GGUF's `general.sampling.{temp, top_k, top_p,
    /// min_p, penalty_repeat}` where the file has them.
    pub fn from_gguf(gguf: &GgufFile) -> Self {
        let mut d = Self::default();
        let f = |key: &str| {
            gguf.get(&format!("general.sampling.{key}"))
                .ok()
                .and_then(|v| v.as_f64())
                .filter(|x| x.is_finite())
        };
        if let Some(t) = f("temp").filter(|&t| (0.0..=2.0).contains(&t)) {
            d.temperature = t as f32;
        }
        if let Some(k) = f("top_k").filter(|&k| k >= 0.0) {
            d.top_k = k as usize;
        }
        if let Some(p) = f("top_p").filter(|&p| p > 0.0 && p <= 1.0) {
            d.top_p = p as f32;
        }
        if let Some(p) = f("min_p").filter(|&p| (0.0..=1.0).contains(&p)) {
            d.min_p = p as f32;
        }
        if let Some(r) = f("penalty_repeat").filter(|&r| r > 0.0) {
            d.repetition_penalty = r as f32;
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::writer::GgufWriter;
    use crate::model::gguf::MetaValue;

    #[test]
    fn metadata_replaces_the_llama_server_defaults_key_by_key() {
        let plain = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
        assert_eq!(
            GenerationDefaults::from_gguf(&plain),
            GenerationDefaults::default()
        );
        let mut w = GgufWriter::new();
        w.meta("general.sampling.temp", MetaValue::F32(0.6))
            .meta("general.sampling.top_k", MetaValue::I32(20));
        let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let d = GenerationDefaults::from_gguf(&g);
        assert_eq!((d.temperature, d.top_k), (0.6, 20));
        assert_eq!((d.top_p, d.min_p), (0.95, 0.05));
    }
}
