//! `GET /health` against the engine, on a fresh connection each time.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use std::sync::{Mutex, PoisonError};

use super::RankStatus;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `Ok` when `GET http://addr/health` answers 200 within `timeout`; else why not. The ranks
/// the engine reported (if it answered at all) go to `ranks`.
pub(crate) async fn probe(
    addr: SocketAddr,
    timeout: Duration,
    ranks: &Mutex<Vec<RankStatus>>,
) -> Result<(), String> {
    let answer = tokio::time::timeout(timeout, get_health(addr)).await;
    let mut seen = ranks.lock().unwrap_or_else(PoisonError::into_inner);
    match &answer {
        Ok(Ok((_, body))) => *seen = parse_ranks(body),
        // No answer: every rank we knew of is down as far as anyone can tell.
        _ => seen.iter_mut().for_each(|r| r.up = false),
    }
    drop(seen);
    match answer {
        Ok(Ok((StatusCode::OK, _))) => Ok(()),
        Ok(Ok((status, _))) => Err(format!("GET /health answered {status}")),
        Ok(Err(e)) => Err(format!("GET /health failed: {e}")),
        Err(_) => Err(format!("GET /health timed out after {timeout:?}")),
    }
}

/// The `ranks` array of the engine's `/health` body.
fn parse_ranks(body: &[u8]) -> Vec<RankStatus> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let Some(ranks) = v["ranks"].as_array() else {
        return Vec::new();
    };
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    ranks
        .iter()
        .map(|r| RankStatus {
            rank: n(&r["rank"]) as usize,
            up: r["up"].as_bool().unwrap_or(false),
            layers: [n(&r["layers"][0]) as usize, n(&r["layers"][1]) as usize],
            kv_tokens_total: n(&r["kv_tokens_total"]),
            kv_tokens_used: n(&r["kv_tokens_used"]),
        })
        .collect()
}

async fn get_health(addr: SocketAddr) -> Result<(StatusCode, Bytes), BoxError> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let req = Request::get("/health")
        .header(header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let answer = async {
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, BoxError>((status, body))
    }
    .await;
    conn.abort();
    answer
}
