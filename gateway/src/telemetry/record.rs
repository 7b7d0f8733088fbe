//! What the layers learn about a request, shared with the code that records its outcome at the
//! end: layer 1 inserts a [`RequestRecord`] extension, the layers below fill it in.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

use crate::policy::Class;

/// A request's facts so far (a request extension; clones share it).
#[derive(Clone, Debug)]
pub struct RequestRecord(Arc<Mutex<Facts>>);

/// The facts.
#[derive(Clone, Copy, Debug)]
pub struct Facts {
    pub arrived: Instant,
    pub class: Class,
    /// The prompt's length, once counted.
    pub prompt_tokens: Option<usize>,
}

impl RequestRecord {
    pub fn new(arrived: Instant) -> Self {
        Self(Arc::new(Mutex::new(Facts {
            arrived,
            class: Class::Interactive,
            prompt_tokens: None,
        })))
    }

    pub fn facts(&self) -> Facts {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set_class(&self, class: Class) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).class = class;
    }

    pub fn set_prompt_tokens(&self, n: usize) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .prompt_tokens = Some(n);
    }
}
