//! The exporter: a [`SpanSink`] that queues finished spans without ever blocking the request
//! that made them, and a task that sends them in batches (the OpenTelemetry SDK's batch span
//! processor, with its `OTEL_BSP_*` settings).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, Instant};

use super::config::OtlpConfig;
use super::encode::export_request;
use super::transport::Transport;
use crate::trace::{set_sink, SpanRecord, SpanSink};

enum Command {
    Span(SpanRecord),
    /// Send everything queued so far, then answer.
    Flush(oneshot::Sender<()>),
}

/// The process's OTLP exporter.
#[derive(Debug)]
pub struct OtlpExporter {
    tx: mpsc::Sender<Command>,
    dropped: AtomicU64,
}

impl SpanSink for OtlpExporter {
    fn record(&self, span: SpanRecord) {
        if self.tx.try_send(Command::Span(span)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl OtlpExporter {
    /// Starts the export task on the current Tokio runtime.
    pub fn start(config: OtlpConfig) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(config.max_queue);
        tokio::spawn(run(rx, Transport::new(config)));
        Arc::new(Self {
            tx,
            dropped: AtomicU64::new(0),
        })
    }

    /// Sends what is queued and waits until it has been sent (or has failed): for shutdown.
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Command::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Spans dropped because the queue was full (the collector slower than the traffic).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Starts an exporter and makes it the process's span sink; the caller keeps it to flush at
/// shutdown.
pub fn install(config: OtlpConfig) -> Arc<OtlpExporter> {
    tracing::info!(
        url = %config.url,
        protocol = config.protocol.as_str(),
        service = %config.service_name,
        "exporting traces over OTLP"
    );
    let exporter = OtlpExporter::start(config);
    if !set_sink(exporter.clone()) {
        tracing::warn!("a span sink was already installed; OTLP export is not used");
    }
    exporter
}

async fn run(mut rx: mpsc::Receiver<Command>, transport: Transport) {
    let config = transport.config().clone();
    let mut failures = 0u64;
    let mut batch = Vec::with_capacity(config.max_batch);
    while let Some(first) = rx.recv().await {
        let mut ack = None;
        match first {
            Command::Span(s) => batch.push(s),
            Command::Flush(a) => ack = Some(a),
        }
        // Gather until the delay has passed, the batch is full, or someone asks for a flush.
        let deadline = Instant::now() + config.batch_delay;
        while ack.is_none() && batch.len() < config.max_batch {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(Command::Span(s)) => batch.push(s),
                    Some(Command::Flush(a)) => ack = Some(a),
                    None => break,
                },
                () = sleep_until(deadline) => break,
            }
        }
        if ack.is_some() {
            // A flush takes everything already queued behind it too.
            while let Ok(Command::Span(s)) = rx.try_recv() {
                batch.push(s);
            }
        }
        for chunk in batch.chunks(config.max_batch) {
            send(&transport, chunk, &mut failures).await;
        }
        batch.clear();
        if let Some(a) = ack {
            let _ = a.send(());
        }
    }
}

/// Sends one batch; the first failure of a run is a warning, the rest are debug lines, so a
/// missing collector costs one log line, not one per request.
async fn send(transport: &Transport, spans: &[SpanRecord], failures: &mut u64) {
    let config = transport.config();
    match transport
        .export(&export_request(&config.service_name, spans))
        .await
    {
        Ok(()) => {
            if *failures > 0 {
                tracing::info!(failed_exports = *failures, "OTLP export recovered");
            }
            *failures = 0;
        }
        Err(e) => {
            if *failures == 0 {
                tracing::warn!(url = %config.url, error = %e, spans = spans.len(),
                    "OTLP export failed; spans are dropped until the collector answers");
            } else {
                tracing::debug!(error = %e, spans = spans.len(), "OTLP export failed again");
            }
            *failures += 1;
        }
    }
}
