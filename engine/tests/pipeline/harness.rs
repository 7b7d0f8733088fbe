//! Starts the real `sluice-engine serve` (and hand-started ranks) on loopback, and talks HTTP
//! to it with a small blocking client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// A running `serve`; dropping it kills the process (its ranks follow).
pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn engine_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice-engine"));
    c.stdin(Stdio::null());
    c
}

/// Starts `serve` with `args` on an ephemeral port and waits until it answers.
pub fn start(args: &[&str]) -> Server {
    try_start(args, &[]).unwrap_or_else(|e| panic!("serve {args:?} did not start: {e}"))
}

/// Starts `serve`; `Err` carries what it printed if it exited before serving.
pub fn try_start(args: &[&str], env: &[(&str, &str)]) -> Result<Server, String> {
    let mut cmd = engine_cmd();
    cmd.arg("serve")
        .args([
            "--model",
            &model_path().to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
            "--exit-with-parent",
        ])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().ok_or("no stderr")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(addr) = line.split("http://").nth(1) {
                    // Keep draining its stderr so the server never blocks on a full pipe.
                    std::thread::spawn(move || for _ in rx {});
                    return Ok(Server {
                        child,
                        addr: addr.trim().to_owned(),
                    });
                }
                seen.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("exited with {status}: {}", seen.join("\n")));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().map_err(|e| e.to_string())?;
                return Err(format!("exited with {status}: {}", seen.join("\n")));
            }
        }
    }
    let _ = child.kill();
    Err(format!("no server after 60 s: {}", seen.join("\n")))
}

/// One HTTP/1.1 request with `Connection: close`; returns the status and body.
pub fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, dechunk(&body))
}

/// Undoes chunked transfer encoding if the body looks chunked.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            return body.to_owned();
        };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            return body.to_owned();
        };
        if n == 0 {
            return out;
        }
        if after.len() < n {
            return body.to_owned();
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
}

pub fn post_json(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = http(addr, "POST", path, Some(body));
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub fn health(addr: &str) -> Value {
    let (_, text) = http(addr, "GET", "/health", None);
    serde_json::from_str(&text).expect("health JSON")
}

/// A greedy completion's text.
pub fn complete(addr: &str, prompt: &str, max_tokens: u32) -> String {
    let (status, v) = post_json(
        addr,
        "/v1/completions",
        &serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], max_tokens, "{v}");
    v["choices"][0]["text"].as_str().expect("text").to_owned()
}

/// Opens a streaming request and returns the open stream after its first data line.
pub fn open_stream(addr: &str, body: &Value) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let body = body.to_string();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while r.read_line(&mut line).expect("read") > 0 {
        if line.contains("data: ") {
            return r;
        }
        line.clear();
    }
    panic!("the stream ended before any data");
}

/// Waits until `f` holds, polling every 50 ms, for up to `secs`.
pub fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// The pids of `pid`'s child processes.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out
}

/// The command line of process `pid`, space-separated.
pub fn cmdline(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .replace('\0', " ")
}
