//! Issue 32, case 8: a flood of wrong admin tokens cannot lock the operator out.
//! Its own test binary: the line of wrong tokens is process-wide.

#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http::{Request, StatusCode};
use switchyard_router::admin::{admin_app, AdminState};

use support::{send, Reply};

const TOKEN: &str = "admin-secret";

async fn get_status(app: &Router, token: &str) -> Reply {
    let request = Request::get("/admin/status")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    send(app, request).await
}

/// 200 wrong tokens at once: a few wait their turn in the 250 ms line, the rest
/// are refused at once with `Connection: close`; the right token is answered
/// immediately throughout (the flood held the connection cap before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_past_the_line_are_refused_at_once() {
    let app = admin_app(AdminState::new(TOKEN.to_owned(), None, None));
    let started = Instant::now();
    let flood: Vec<_> = (0..200)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { get_status(&app, "wrong").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let right_started = Instant::now();
    let right = get_status(&app, TOKEN).await;
    assert_ne!(right.status, StatusCode::UNAUTHORIZED, "{}", right.text);
    assert!(right_started.elapsed() < Duration::from_millis(200));
    let mut refused_at_once = 0;
    let mut waited = 0;
    for reply in flood {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        match reply.json()["error"]["code"].as_str() {
            Some("too_many_wrong_tokens") => {
                assert_eq!(reply.headers["connection"], "close");
                refused_at_once += 1;
            }
            Some("invalid_admin_token") => waited += 1,
            other => panic!("{other:?}: {}", reply.text),
        }
    }
    assert!(waited <= 8 + 1, "{waited} waited in line");
    assert!(refused_at_once >= 190, "{refused_at_once} refused at once");
    // The few in line took 250 ms each; nothing waited for all 200.
    assert!(started.elapsed() < Duration::from_secs(5));
}
