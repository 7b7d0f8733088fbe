//! `GET /health` against the engine, on a fresh connection each time.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `Ok` when `GET http://addr/health` answers 200 within `timeout`; else why not.
pub(crate) async fn probe(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, get_health(addr)).await {
        Ok(Ok(StatusCode::OK)) => Ok(()),
        Ok(Ok(status)) => Err(format!("GET /health answered {status}")),
        Ok(Err(e)) => Err(format!("GET /health failed: {e}")),
        Err(_) => Err(format!("GET /health timed out after {timeout:?}")),
    }
}

async fn get_health(addr: SocketAddr) -> Result<StatusCode, BoxError> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let req = Request::get("/health")
        .header(header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(req);
    tokio::pin!(conn);
    tokio::select! {
        resp = response => Ok(resp?.status()),
        done = &mut conn => {
            done?;
            Err("the engine closed the connection before answering".into())
        }
    }
}
