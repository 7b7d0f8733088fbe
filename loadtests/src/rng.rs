//! Random streams on the engine's SplitMix64: enough to pick sentences, needle codes and
//! Poisson gaps. A load test needs the same run from the same seed, not cryptography.

/// One random stream; `stream` separates the streams of one seed (one per request, say).
#[derive(Debug, Clone)]
pub struct Rng(sluice_engine::generate::Rng);

impl Rng {
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut r = Self(sluice_engine::generate::Rng::new(
            seed ^ stream.wrapping_mul(0xD134_2543_DE82_EF95),
        ));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An exponential variate of mean `1 / rate`: the gap between Poisson arrivals.
    pub fn exponential(&mut self, rate: f64) -> f64 {
        -(1.0 - self.unit()).ln() / rate
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(1, 2).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(Rng::new(1, 2).next_u64(), Rng::new(1, 3).next_u64());
    }

    #[test]
    fn exponential_gaps_have_the_rate_as_mean() {
        let mut r = Rng::new(42, 0);
        let n = 200_000;
        let mean = (0..n).map(|_| r.exponential(4.0)).sum::<f64>() / n as f64;
        assert!((mean - 0.25).abs() < 0.005, "{mean}");
        let mut r = Rng::new(42, 0);
        assert!((0..1000).all(|_| (0.0..1.0).contains(&r.unit())));
    }
}
