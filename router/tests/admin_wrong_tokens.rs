//! Issue 32, case 8: a flood of wrong admin tokens cannot lock the operator out.
//! Its own test binary: the line of wrong tokens is process-wide.
//!
//! On tokio's paused clock: time moves only when every task waits on a timer, so
//! "answered at once" and "the line took its turns" are exact, whatever the host's
//! load (a wall-clock 200 ms bound failed when a busy machine descheduled the runtime).

#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use tokio::time::Instant;

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
#[tokio::test(start_paused = true)]
async fn wrong_tokens_past_the_line_are_refused_at_once() {
    let app = admin_app(AdminState::new(TOKEN.to_owned(), None, None));
    let started = Instant::now();
    let flood: Vec<_> = (0..200)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { get_status(&app, "wrong").await })
        })
        .collect();
    // The flood runs while this waits: eight wrong tokens in the line, one of them
    // holding it for its 250 ms, the rest refused.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let right_started = Instant::now();
    let right = get_status(&app, TOKEN).await;
    assert_ne!(right.status, StatusCode::UNAUTHORIZED, "{}", right.text);
    // No timer ran for it: a turn in the line would have moved the clock 250 ms.
    assert_eq!(
        right_started.elapsed(),
        Duration::ZERO,
        "the right token waited"
    );
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
