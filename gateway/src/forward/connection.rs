//! Which connection an attempt went out on. The connector stamps every connection it opens
//! with the instant it opened, so that an attempt that failed can tell a pooled keep-alive
//! connection the upstream had already given up on from a connection opened for it.
//!
//! Some servers close a keep-alive connection without saying so: llama.cpp's `llama-server`
//! hangs up after every streamed answer although it announced `Keep-Alive: timeout=5`, and
//! any server may close an idle one just as a request is written to it. A request sent on
//! such a connection gets nothing back and was never read; it is sent again, once, on a new
//! connection. A request that failed on a connection opened for it is never sent again: that
//! upstream read it, and may have started generating (or crashed on it).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{CaptureConnection, Connected, Connection};
use tower::Service;

use crate::BoxFuture;

/// When a connection was opened (an extra of its [`Connected`]).
#[derive(Clone, Copy, Debug)]
struct Opened(Instant);

/// A connector whose connections carry their opening instant.
#[derive(Clone, Debug)]
pub struct Stamping<C>(pub C);

impl<C> Service<Uri> for Stamping<C>
where
    C: Service<Uri>,
    C::Future: Send + 'static,
    C::Response: 'static,
    C::Error: 'static,
{
    type Response = Stamped<C::Response>;
    type Error = C::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            Ok(Stamped {
                io,
                opened: Instant::now(),
            })
        })
    }
}

/// A connection and when it was opened.
#[derive(Debug)]
pub struct Stamped<T> {
    io: T,
    opened: Instant,
}

impl<T: Connection> Connection for Stamped<T> {
    fn connected(&self) -> Connected {
        self.io.connected().extra(Opened(self.opened))
    }
}

impl<T: Read + Unpin> Read for Stamped<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Stamped<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

/// Whether an attempt that started at `sent` and failed with `e` went out on a connection
/// that was already open (pooled) and was closed with no answer: safe to send again.
pub fn closed_before_answering(
    conn: &CaptureConnection,
    sent: Instant,
    e: &hyper_util::client::legacy::Error,
) -> bool {
    let pooled = conn.connection_metadata().as_ref().is_some_and(|c| {
        let mut extras = http::Extensions::new();
        c.get_extras(&mut extras);
        extras.get::<Opened>().is_some_and(|o| o.0 < sent)
    });
    pooled && !e.is_connect() && hung_up(e)
}

/// The connection ended under the request: closed before a whole answer, reset, or broken.
fn hung_up(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_closed() {
                return true;
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof
            ) {
                return true;
            }
        }
        cause = c.source();
    }
    false
}
