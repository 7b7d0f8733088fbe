//! Policy reload under load: the admission ceiling follows edits of the policy file while
//! requests keep arriving, and a broken edit changes nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use serde_json::json;
use sluice_gateway::policy::{spawn_reloader, Guard, LoadedPolicy};

use crate::common::{eventually, Gateway, ScriptedUpstream};

fn policy_text(active_max: usize) -> String {
    format!(
        "[admission]\nactive_max = {active_max}\nqueue_depth = 64\nqueue_wait_max = \"60s\"\n\
         heavy_active_max = 1\n\n[upstream]\nkind = \"openai\"\nurls = [\"http://127.0.0.1:9\"]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_max_follows_edits_under_load_and_a_broken_edit_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("sluice-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("policy.toml");
    std::fs::write(&file, policy_text(4)).expect("write");
    let loaded = LoadedPolicy::from_file(&file).expect("valid");

    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(loaded.policy.clone(), up.upstream()).await;
    gw.app.policy.replace(loaded);
    let reloads = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let (r, e) = (reloads.clone(), errors.clone());
    let _watch = spawn_reloader(
        file.clone(),
        gw.app.policy.clone(),
        Guard::new(gw.addr),
        move |res| {
            match res {
                Ok(_) => r.fetch_add(1, Ordering::SeqCst),
                Err(_) => e.fetch_add(1, Ordering::SeqCst),
            };
        },
    )
    .expect("watch");

    // The upstream answers every request after 150 ms.
    tokio::spawn(async move {
        while let Some(a) = up.arrivals.recv().await {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let mut tx = a.tx;
                let _ = tx.send_data(Bytes::from_static(b"data: [DONE]\n\n")).await;
            });
        }
    });
    // Eight clients keep a request in flight each.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (c, stop, failures, done) = (gw.client(), stop.clone(), failures.clone(), done.clone());
        clients.push(tokio::spawn(async move {
            let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 4});
            while !stop.load(Ordering::SeqCst) {
                let (status, _, v) = c.post("/v1/chat/completions", &body).await;
                if status != StatusCode::OK {
                    eprintln!("failed: {status} {v}");
                    failures.fetch_add(1, Ordering::SeqCst);
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let adm = gw.app.admission.clone();
    assert!(
        eventually(Duration::from_secs(5), || adm.snapshot().active == 4).await,
        "4 active at first"
    );

    for (ceiling, sha_before) in [(2usize, None::<String>), (6, None)] {
        let _ = sha_before;
        std::fs::write(&file, policy_text(ceiling)).expect("write");
        assert!(
            eventually(Duration::from_secs(3), || adm.snapshot().active_max
                == ceiling)
            .await,
            "the reload to {ceiling} was not applied"
        );
        // Within a second of the swap, the active count follows the new ceiling.
        assert!(
            eventually(Duration::from_secs(1), || adm.snapshot().active == ceiling).await,
            "active is {} after the ceiling became {ceiling}",
            adm.snapshot().active
        );
        let mut peak = 0;
        for _ in 0..20 {
            peak = peak.max(adm.snapshot().active);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(peak <= ceiling, "peak {peak} over the ceiling {ceiling}");
    }

    // A broken edit: refused, reported, and the ceiling stays 6.
    let sha = gw.app.policy.current().sha256.clone();
    std::fs::write(&file, "[admission]\nactive_max = \"many\"\n").expect("write");
    assert!(
        eventually(Duration::from_secs(3), || errors.load(Ordering::SeqCst)
            >= 1)
        .await
    );
    assert_eq!(gw.app.policy.current().sha256, sha);
    assert_eq!(adm.snapshot().active_max, 6);
    assert!(eventually(Duration::from_secs(1), || adm.snapshot().active == 6).await);

    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client");
    }
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "requests failed during reloads"
    );
    assert!(
        done.load(Ordering::SeqCst) >= 16,
        "{} requests",
        done.load(Ordering::SeqCst)
    );
    assert!(reloads.load(Ordering::SeqCst) >= 2);
    gw.assert_accounted().await;
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request keeps the policy it arrived under: one that waits in the queue while a reload
/// swaps in another policy is forwarded with the first policy's model mapping and token cap,
/// and the next arrival gets the new policy's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_keeps_the_policy_it_arrived_under() {
    let mut a = LoadedPolicy::defaults();
    a.policy.admission.active_max = 1;
    a.policy.limits.max_tokens_max = 8;
    a.policy
        .upstream
        .models
        .insert("alias".into(), "model-a".into());
    let mut b = a.clone();
    b.policy.limits.max_tokens_max = 16;
    b.policy
        .upstream
        .models
        .insert("alias".into(), "model-b".into());
    b.sha256 = "b".repeat(64);

    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(a.policy.clone(), up.upstream()).await;
    gw.app.policy.replace(a);
    let body = json!({"model": "alias", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100});
    // The first request holds the only slot until the test answers it.
    let first = {
        let (c, body) = (gw.client(), body.clone());
        tokio::spawn(async move { c.post("/v1/chat/completions", &body).await })
    };
    let held = up.arrivals.recv().await.expect("first arrival");
    let queued = {
        let (c, body) = (gw.client(), body.clone());
        tokio::spawn(async move { c.post("/v1/chat/completions", &body).await })
    };
    let adm = gw.app.admission.clone();
    assert!(
        eventually(Duration::from_secs(5), || adm.snapshot().queued_interactive
            == 1)
        .await,
        "the second request did not queue"
    );
    gw.app.policy.replace(b);
    drop(held);
    let second = up.arrivals.recv().await.expect("second arrival");
    assert_eq!(second.body["model"], "model-a", "{}", second.body);
    assert_eq!(second.body["max_tokens"], 8, "{}", second.body);
    drop(second);
    let third = {
        let (c, body) = (gw.client(), body.clone());
        tokio::spawn(async move { c.post("/v1/chat/completions", &body).await })
    };
    let arrived = up.arrivals.recv().await.expect("third arrival");
    assert_eq!(arrived.body["model"], "model-b", "{}", arrived.body);
    assert_eq!(arrived.body["max_tokens"], 16, "{}", arrived.body);
    drop(arrived);
    for r in [first, queued, third] {
        assert_eq!(r.await.expect("client").0, StatusCode::OK);
    }
}
