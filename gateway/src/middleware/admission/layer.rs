//! The admission layer.

use std::sync::Arc;

use tower::Layer;

use super::queue::Admission;
use super::service::Admit;
use super::shed::Shed;
use crate::telemetry::Metrics;

/// Wraps a service in admission control: [`Shed`] around [`Admit`].
#[derive(Clone, Debug)]
pub struct AdmissionLayer {
    admission: Arc<Admission>,
    metrics: Arc<Metrics>,
}

impl AdmissionLayer {
    pub fn new(admission: Arc<Admission>, metrics: Arc<Metrics>) -> Self {
        Self { admission, metrics }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Shed<Admit<S>>;

    fn layer(&self, inner: S) -> Self::Service {
        let admit = Admit::new(inner, self.admission.clone(), self.metrics.clone());
        Shed::new(admit, self.admission.clone())
    }
}
