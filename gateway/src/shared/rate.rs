//! The shared GCRA: one theoretical arrival time per tenant in Redis, checked and advanced in
//! one script on Redis's clock, so every gateway admits from the same bucket.

use std::time::Duration;

use super::scripts::GCRA;
use super::{Shared, Unavailable};

impl Shared {
    /// Takes one request from `tenant`'s bucket of `rate` per second and `burst`: `Ok(Ok(()))`
    /// admitted, `Ok(Err(wait))` not before `wait`, `Err` when the state is unavailable.
    pub async fn gcra(
        &self,
        tenant: &str,
        rate: f64,
        burst: u32,
    ) -> Result<Result<(), Duration>, Unavailable> {
        let period_us = (1e6 / rate).round().max(1.0) as u64;
        let (ok, wait_us): (u8, u64) = self
            .store
            .script(
                "gcra",
                GCRA.key(self.keys.rate(tenant))
                    .arg(period_us)
                    .arg(burst.max(1)),
            )
            .await?;
        Ok(if ok == 1 {
            Ok(())
        } else {
            Err(Duration::from_micros(wait_us))
        })
    }
}
