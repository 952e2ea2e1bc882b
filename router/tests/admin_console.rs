//! The operator console on the admin listener: its page and files are served without the
//! token, with their content types and a strict Content-Security-Policy, and refer to
//! nothing outside the server; every data route still needs the token; the activity
//! endpoint samples the model adapter's executor counters.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http::{Request, StatusCode};
use serde_json::{json, Value};
use switchyard_router::admin::console::CONTENT_SECURITY_POLICY_VALUE;
use switchyard_router::admin::{admin_app, AdminError, AdminErrorKind, AdminState, ModelAdmin};

use support::{send, Reply};

const TOKEN: &str = "console-secret";

/// Answers like the engine adapter: an executor with counters, one model.
struct FakeEngine;

impl ModelAdmin for FakeEngine {
    fn models(&self) -> Value {
        json!({"models": [{"name": "small", "active_version": "1", "versions": []}], "memory": {}})
    }
    fn status(&self) -> Value {
        json!({"executor": {"running": true, "queued": 3, "active_sequences": 5, "steps": 40, "swaps": 7}})
    }
    fn load(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        Ok(json!({"model": model, "version": version}))
    }
    fn unload(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        Ok(json!({"model": model, "version": version}))
    }
    fn activate(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        Ok(json!({"model": model, "active_version": version}))
    }
    fn rollback(&self, _model: &str) -> Result<Value, AdminError> {
        Err(AdminError {
            kind: AdminErrorKind::Conflict,
            message: "nothing to roll back to".to_owned(),
        })
    }
}

fn console_app() -> Router {
    admin_app(AdminState::new(
        TOKEN.to_owned(),
        None,
        Some(Arc::new(FakeEngine) as Arc<dyn ModelAdmin>),
    ))
}

async fn call(app: &Router, method: &str, path: &str, token: Option<&str>) -> Reply {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    send(app, request.body(Body::empty()).unwrap()).await
}

const ASSETS: [(&str, &str); 5] = [
    ("/admin/console", "text/html; charset=utf-8"),
    ("/admin/console/", "text/html; charset=utf-8"),
    (
        "/admin/console/console.js",
        "text/javascript; charset=utf-8",
    ),
    ("/admin/console/console.css", "text/css; charset=utf-8"),
    ("/admin/console/icon.svg", "image/svg+xml"),
];

#[tokio::test]
async fn the_console_is_served_without_the_token_under_a_strict_csp() {
    let app = console_app();
    for (path, content_type) in ASSETS {
        let reply = call(&app, "GET", path, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text);
        assert_eq!(reply.headers["content-type"], content_type, "{path}");
        assert_eq!(
            reply.headers["content-security-policy"], CONTENT_SECURITY_POLICY_VALUE,
            "{path}"
        );
        assert_eq!(reply.headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(reply.headers["x-frame-options"], "DENY", "{path}");
        assert_eq!(reply.headers["referrer-policy"], "no-referrer", "{path}");
        assert!(!reply.text.is_empty(), "{path}");
        // Nothing outside the server: the only absolute URL is the SVG namespace name,
        // which is an identifier, never fetched.
        let outside = reply
            .text
            .replace("http://www.w3.org/2000/svg", "")
            .contains("://");
        assert!(!outside, "{path} refers to another origin");
        // The token goes in a header, never in a URL or a cookie.
        assert!(!reply.text.contains("document.cookie"), "{path}");
        assert!(!reply.text.contains("localStorage"), "{path}");
    }
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(
            CONTENT_SECURITY_POLICY_VALUE.contains(directive),
            "{directive}"
        );
    }
    assert!(!CONTENT_SECURITY_POLICY_VALUE.contains("unsafe"));

    let page = call(&app, "GET", "/admin/console", None).await.text;
    assert!(page.contains(r#"<script src="/admin/console/console.js" defer></script>"#));
    // The CSP allows no inline script or style: the page must not need any.
    assert_eq!(page.matches("<script").count(), 1, "one script, by src");
    assert!(!page.contains("style="), "no inline style attributes");
    assert!(!page.contains(" onclick="), "no inline handlers");
    let script = call(&app, "GET", "/admin/console/console.js", None)
        .await
        .text;
    assert!(script.contains("sessionStorage"));
    assert!(script.contains("Authorization: `Bearer ${token}`"));
    assert!(!script.contains("innerHTML"), "server text goes in as text");
}

#[tokio::test]
async fn the_data_routes_still_need_the_token() {
    let app = console_app();
    for (method, path) in [
        ("GET", "/admin/models"),
        ("GET", "/admin/status"),
        ("GET", "/admin/activity"),
        ("GET", "/admin/policy"),
        ("POST", "/admin/models/small/versions/2/activate"),
        ("POST", "/admin/models/small/rollback"),
        ("POST", "/admin/policy/reload"),
        // Paths beside the console's files are not part of it.
        ("GET", "/admin/console/other.js"),
        ("GET", "/admin/console/../models"),
    ] {
        let missing = call(&app, method, path, None).await;
        assert_eq!(missing.status, StatusCode::UNAUTHORIZED, "{method} {path}");
        assert_eq!(missing.json()["error"]["code"], "missing_admin_token");
        let wrong = call(&app, method, path, Some("console-secreT")).await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{method} {path}");
        assert_eq!(wrong.json()["error"]["code"], "invalid_admin_token");
    }
    let models = call(&app, "GET", "/admin/models", Some(TOKEN)).await;
    assert_eq!(models.status, StatusCode::OK, "{}", models.text);
    assert_eq!(models.json()["models"][0]["name"], "small");
}

#[tokio::test]
async fn activity_samples_the_executor_counters() {
    let app = console_app();
    // The sampler takes its first sample at once, off the async workers: polled for
    // it with a budget that only guards against a hang (a loaded machine can keep the
    // blocking thread off a core for seconds).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let samples = loop {
        let reply = call(&app, "GET", "/admin/activity", Some(TOKEN)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let body = reply.json();
        assert_eq!(body["interval_ms"], 2000);
        let samples = body["samples"].as_array().cloned().unwrap_or_default();
        if !samples.is_empty() {
            break samples;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no sample within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let sample = samples.first().expect("the loop ends on a sample");
    assert_eq!(sample["swaps"], 7);
    assert_eq!(sample["steps"], 40);
    assert_eq!(sample["queued"], 3);
    assert_eq!(sample["running"], 5);
    assert!(sample["at_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
    assert!(sample["generated_tokens"].is_u64());
}
