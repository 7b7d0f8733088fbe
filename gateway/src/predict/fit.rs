//! Online least squares: a Kalman filter over a linear model's coefficients, seeded with a
//! prior (the calibrated values) and refitted from every observation.
//!
//! The prior's variance says how far the seed may be trusted; the process noise keeps the
//! filter following an upstream whose speed drifts (another tenant on the machine, a new
//! build) instead of freezing after its first thousand observations. Coefficients stay
//! non-negative: every term is a cost.

/// The prior variance added to each coefficient per observation. At 1% the fit forgets
/// within about ten observations: this machine's engine got 2-3x slower within minutes when
/// other work started, and its first requests after a start are slower than the next ones
/// (the replay in `admission::replay_tests` has one at 53 ms, the next six at 17-30 ms); at
/// 0.1% the fit was still 25% high five requests later.
const DRIFT: f64 = 1e-2;

/// A linear model `y = θ · x` over `N` features, fitted online.
#[derive(Clone, Debug, PartialEq)]
pub struct OnlineFit<const N: usize> {
    theta: [f64; N],
    cov: [[f64; N]; N],
    /// Variance added to each coefficient per observation (random-walk drift).
    drift: [f64; N],
    observations: u64,
}

impl<const N: usize> OnlineFit<N> {
    /// A fit starting at `seed`, each coefficient trusted to within `spread` (one standard
    /// deviation, in the coefficient's own unit).
    pub fn new(seed: [f64; N], spread: [f64; N]) -> Self {
        let mut cov = [[0.0; N]; N];
        let mut drift = [0.0; N];
        for i in 0..N {
            cov[i][i] = spread[i] * spread[i];
            drift[i] = cov[i][i] * DRIFT;
        }
        Self {
            theta: seed.map(|t| t.max(0.0)),
            cov,
            drift,
            observations: 0,
        }
    }

    pub fn coefficients(&self) -> [f64; N] {
        self.theta
    }

    pub fn observations(&self) -> u64 {
        self.observations
    }

    pub fn predict(&self, x: &[f64; N]) -> f64 {
        dot(&self.theta, x)
    }

    /// One observation `y` at features `x`, with measurement noise `noise` (standard
    /// deviation, in `y`'s unit).
    pub fn observe(&mut self, x: &[f64; N], y: f64, noise: f64) {
        if !y.is_finite() || x.iter().any(|v| !v.is_finite()) {
            return;
        }
        for i in 0..N {
            self.cov[i][i] += self.drift[i];
        }
        let px: [f64; N] = std::array::from_fn(|i| dot(&self.cov[i], x));
        let s = dot(x, &px) + noise * noise;
        if s <= 0.0 || !s.is_finite() {
            return;
        }
        let gain: [f64; N] = px.map(|v| v / s);
        let err = y - self.predict(x);
        for (theta, g) in self.theta.iter_mut().zip(&gain) {
            *theta = (*theta + g * err).max(0.0);
        }
        // P ← P − K (P x)ᵀ, kept symmetric.
        for (row, g) in self.cov.iter_mut().zip(&gain) {
            for (c, p) in row.iter_mut().zip(&px) {
                *c -= g * p;
            }
        }
        for i in 0..N {
            self.cov[i][i] = self.cov[i][i].max(1e-12);
            for j in 0..i {
                let m = 0.5 * (self.cov[i][j] + self.cov[j][i]);
                self.cov[i][j] = m;
                self.cov[j][i] = m;
            }
        }
        self.observations += 1;
    }
}

fn dot<const N: usize>(a: &[f64; N], b: &[f64; N]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_to_the_true_coefficients_from_a_wrong_seed() {
        // y = 0.05 + 0.6 k + 0.2 k² (seconds; k = thousands of tokens).
        let truth = [0.05, 0.6, 0.2];
        let mut fit = OnlineFit::new([0.01, 0.1, 0.0], [0.1, 1.0, 1.0]);
        for i in 0..400 {
            let k = [0.25, 1.0, 4.0, 8.0][i % 4] * (1.0 + 0.01 * (i % 7) as f64);
            let x = [1.0, k, k * k];
            fit.observe(&x, dot(&truth, &x), 0.05);
        }
        let got = fit.coefficients();
        for (g, t) in got.iter().zip(truth) {
            assert!((g - t).abs() < 0.02, "{got:?}");
        }
        assert_eq!(fit.observations(), 400);
    }

    #[test]
    fn follows_a_drift_and_never_goes_negative() {
        let mut fit = OnlineFit::new([0.5, 0.0], [0.5, 0.1]);
        for _ in 0..200 {
            fit.observe(&[1.0, 2.0], 0.2, 0.02);
        }
        assert!((fit.predict(&[1.0, 2.0]) - 0.2).abs() < 0.01);
        // The upstream gets twice as slow: the fit follows within a few hundred requests.
        for _ in 0..300 {
            fit.observe(&[1.0, 2.0], 0.4, 0.02);
        }
        assert!((fit.predict(&[1.0, 2.0]) - 0.4).abs() < 0.02);
        for _ in 0..50 {
            fit.observe(&[1.0, 2.0], -5.0, 0.02);
        }
        assert!(fit.coefficients().iter().all(|c| *c >= 0.0));
        fit.observe(&[f64::NAN, 1.0], 1.0, 0.1);
        assert!(fit.coefficients().iter().all(|c| c.is_finite()));
    }
}
