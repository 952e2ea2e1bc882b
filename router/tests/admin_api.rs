//! The admin API: bearer-token auth, policy show/reload/reset, and the model endpoints
//! delegated to a fake `ModelAdmin`, with every error class mapped to its status.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::Router;
use http::{Request, StatusCode};
use serde_json::{json, Value};
use switchyard_policies::{Policy, PolicyStore};
use switchyard_router::admin::{admin_app, AdminError, AdminErrorKind, AdminState, ModelAdmin};

use support::{send, Reply};

const TOKEN: &str = "admin-secret";

const POLICY: &str = r#"[routing]
allow_anonymous = true

[[models]]
name = "small"
versions = ["v1", "v2"]
cost_per_1k_input = 0.01
cost_per_1k_output = 0.02
quality = 0.5
context_limit = 64

[[splits]]
name = "canary"
model = "small"
sticky = "none"
arms = [
  { name = "stable", target = "small@v1", weight = 90 },
  { name = "canary", target = "small@v2", weight = 10 },
]

[splits.rollback]
baseline = "stable"
candidate = "canary"
window = "10m"
min_samples = 1
max_error_rate_increase = 0.1
"#;

/// Records calls; `unload` conflicts, unknown versions are not found, `bad` is invalid,
/// `busy` is unavailable.
#[derive(Default)]
struct FakeModels {
    calls: Mutex<Vec<String>>,
}

impl FakeModels {
    fn op(&self, what: &str, model: &str, version: &str) -> Result<Value, AdminError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{what} {model}@{version}"));
        let fail = |kind, message: &str| {
            Err(AdminError {
                kind,
                message: message.to_owned(),
            })
        };
        match version {
            "bad" => fail(AdminErrorKind::Invalid, "checkpoint small@bad is corrupt"),
            "busy" => fail(AdminErrorKind::Unavailable, "not enough memory to load"),
            "v1" | "v2" => Ok(json!({"model": model, "version": version, "done": what})),
            _ => fail(AdminErrorKind::NotFound, "no such version"),
        }
    }
}

impl ModelAdmin for FakeModels {
    fn models(&self) -> Value {
        json!({"models": [{"name": "small", "versions": ["v1", "v2"]}]})
    }
    fn status(&self) -> Value {
        json!({"resident": ["small@v1"]})
    }
    fn load(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        self.op("load", model, version)
    }
    fn unload(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        if version == "v1" {
            return Err(AdminError {
                kind: AdminErrorKind::Conflict,
                message: "small@v1 is the active version; activate another first".to_owned(),
            });
        }
        self.op("unload", model, version)
    }
    fn activate(&self, model: &str, version: &str) -> Result<Value, AdminError> {
        self.op("activate", model, version)
    }
    fn rollback(&self, model: &str) -> Result<Value, AdminError> {
        self.op("rollback", model, "v1")
    }
}

async fn call(app: &Router, method: &str, path: &str, token: Option<&str>, body: &str) -> Reply {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    send(app, request.body(Body::from(body.to_owned())).unwrap()).await
}

fn code(reply: &Reply) -> String {
    reply.json()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn policy_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

fn full_app(file: &tempfile::NamedTempFile) -> (Router, Arc<PolicyStore>, Arc<FakeModels>) {
    let store = Arc::new(PolicyStore::open(file.path()).unwrap());
    let models = Arc::new(FakeModels::default());
    let state = AdminState::new(
        TOKEN.to_owned(),
        Some(Arc::clone(&store)),
        Some(models.clone() as Arc<dyn ModelAdmin>),
    );
    (admin_app(state), store, models)
}

#[tokio::test]
async fn every_endpoint_needs_the_token() {
    let file = policy_file(POLICY);
    let (app, _, models) = full_app(&file);
    for (method, path) in [
        ("GET", "/admin/policy"),
        ("POST", "/admin/policy/reload"),
        ("GET", "/admin/models"),
        ("POST", "/admin/models/small/versions/v2/load"),
        ("GET", "/admin/nothing-here"),
    ] {
        let missing = call(&app, method, path, None, "").await;
        assert_eq!(missing.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(code(&missing), "missing_admin_token");
        assert_eq!(missing.headers["www-authenticate"], "Bearer");
        let wrong = call(&app, method, path, Some("admin-secreT"), "").await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(code(&wrong), "invalid_admin_token");
        assert_eq!(wrong.json()["error"]["type"], "authentication_error");
    }
    assert!(models.calls.lock().unwrap().is_empty());
    let ok = call(&app, "GET", "/admin/policy", Some(TOKEN), "").await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    let unknown = call(&app, "GET", "/admin/nothing-here", Some(TOKEN), "").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(code(&unknown), "unknown_url");
}

#[tokio::test]
async fn shows_the_policy_and_reloads_it_atomically() {
    let file = policy_file(POLICY);
    let (app, store, _) = full_app(&file);
    let shown = call(&app, "GET", "/admin/policy", Some(TOKEN), "")
        .await
        .json();
    assert_eq!(shown["generation"], 1);
    assert_eq!(shown["models"][0]["versions"], json!(["v1", "v2"]));
    assert_eq!(shown["splits"][0]["arms"][1]["target"], "small@v2");
    assert_eq!(shown["rollback"][0]["state"]["state"], "watching");
    assert!(shown["last_reload_error"].is_null());

    // A broken body: 422 with line and column, the old policy still in force.
    let broken = POLICY.replace("quality = 0.5", "quality = 1.5");
    let reply = call(&app, "POST", "/admin/policy/reload", Some(TOKEN), &broken).await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.text
    );
    assert_eq!(code(&reply), "invalid_policy");
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("admin-request:9:11:"), "{message}");
    assert!(message.contains("still in force"), "{message}");
    assert_eq!(reply.json()["error"]["diagnostics"][0]["line"], 9);
    assert_eq!(store.generation(), 1);
    assert_eq!(store.current().models()[0].quality, 0.5);
    let shown = call(&app, "GET", "/admin/policy", Some(TOKEN), "")
        .await
        .json();
    assert!(shown["last_reload_error"]
        .as_str()
        .unwrap()
        .contains(":9:11:"));

    // The file edited badly, then well: an empty body re-reads it.
    std::fs::write(file.path(), POLICY.replace("weight = 90", "weight = 91")).unwrap();
    let reply = call(&app, "POST", "/admin/policy/reload", Some(TOKEN), "").await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.text
    );
    assert!(reply.text.contains("sum"), "{}", reply.text);
    assert_eq!(store.generation(), 1);
    std::fs::write(
        file.path(),
        POLICY.replace("quality = 0.5", "quality = 0.6"),
    )
    .unwrap();
    let reply = call(&app, "POST", "/admin/policy/reload", Some(TOKEN), "  ").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.json()["generation"], 2);
    assert!(reply.json()["last_reload_error"].is_null());
    assert_eq!(store.current().models()[0].quality, 0.6);
}

#[tokio::test]
async fn resets_a_tripped_rollback_rule() {
    let file = policy_file(POLICY);
    let (app, store, _) = full_app(&file);
    let policy = store.current();
    let monitor = policy.rollback_monitor("canary").unwrap();
    monitor.record(0, true, 10.0);
    monitor.record(1, false, 10.0);
    assert!(monitor.is_rolled_back());
    let reply = call(
        &app,
        "POST",
        "/admin/policy/splits/canary/reset",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert!(!monitor.is_rolled_back());
    let reply = call(
        &app,
        "POST",
        "/admin/policy/splits/nope/reset",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(code(&reply), "split_not_found");
}

#[tokio::test]
async fn model_endpoints_delegate_and_map_errors() {
    let file = policy_file(POLICY);
    let (app, _, models) = full_app(&file);
    let list = call(&app, "GET", "/admin/models", Some(TOKEN), "").await;
    assert_eq!(list.json()["models"][0]["name"], "small");
    let status = call(&app, "GET", "/admin/status", Some(TOKEN), "").await;
    assert_eq!(status.json()["resident"][0], "small@v1");

    let ok = call(
        &app,
        "POST",
        "/admin/models/small/versions/v2/load",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    assert_eq!(ok.json()["done"], "load");
    let ok = call(
        &app,
        "POST",
        "/admin/models/small/versions/v2/activate",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(ok.json()["done"], "activate");
    let ok = call(
        &app,
        "POST",
        "/admin/models/small/versions/v2/unload",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(ok.json()["done"], "unload");
    let ok = call(
        &app,
        "POST",
        "/admin/models/small/rollback",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(ok.json()["done"], "rollback");

    for (path, status, expected_code) in [
        (
            "/admin/models/small/versions/v1/unload",
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "/admin/models/small/versions/v9/load",
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "/admin/models/small/versions/bad/load",
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_checkpoint",
        ),
        (
            "/admin/models/small/versions/busy/activate",
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
        ),
        (
            "/admin/models/small/versions/v1/explode",
            StatusCode::NOT_FOUND,
            "unknown_url",
        ),
    ] {
        let reply = call(&app, "POST", path, Some(TOKEN), "").await;
        assert_eq!(reply.status, status, "{path}: {}", reply.text);
        assert_eq!(code(&reply), expected_code, "{path}");
    }
    let conflict = call(
        &app,
        "POST",
        "/admin/models/small/versions/v1/unload",
        Some(TOKEN),
        "",
    )
    .await;
    assert!(conflict.text.contains("activate another first"));
    assert_eq!(
        models.calls.lock().unwrap().clone(),
        [
            "load small@v2",
            "activate small@v2",
            "unload small@v2",
            "rollback small@v1",
            "load small@v9",
            "load small@bad",
            "activate small@busy",
        ]
    );
}

#[tokio::test]
async fn absent_parts_say_what_to_configure() {
    let app = admin_app(AdminState::new(TOKEN.to_owned(), None, None));
    let reply = call(&app, "GET", "/admin/policy", Some(TOKEN), "").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(reply.text.contains("--policy FILE"), "{}", reply.text);
    let reply = call(
        &app,
        "POST",
        "/admin/models/small/rollback",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(code(&reply), "not_configured");

    // A store without a file cannot re-read it, but takes a body.
    let store = Arc::new(PolicyStore::new(Policy::from_toml_str(POLICY).unwrap()));
    let app = admin_app(AdminState::new(TOKEN.to_owned(), Some(store), None));
    let reply = call(&app, "POST", "/admin/policy/reload", Some(TOKEN), "").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.text);
    let reply = call(&app, "POST", "/admin/policy/reload", Some(TOKEN), POLICY).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
}
