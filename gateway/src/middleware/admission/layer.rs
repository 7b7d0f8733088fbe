//! The admission layer.

use std::sync::Arc;

use tower::Layer;

use super::queue::Admission;
use super::service::Admit;
use super::shed::Shed;

/// Wraps a service in admission control: [`Shed`] around [`Admit`].
#[derive(Clone, Debug)]
pub struct AdmissionLayer {
    admission: Arc<Admission>,
}

impl AdmissionLayer {
    pub fn new(admission: Arc<Admission>) -> Self {
        Self { admission }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Shed<Admit<S>>;

    fn layer(&self, inner: S) -> Self::Service {
        Shed::new(
            Admit::new(inner, self.admission.clone()),
            self.admission.clone(),
        )
    }
}
