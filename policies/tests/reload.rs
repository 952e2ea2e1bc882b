//! Hot reload: a valid file swaps in whole, a broken one changes nothing.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{request, TWO_MODELS};
use switchyard_policies::{
    route, Caller, IdleEngine, ModelHint, PolicyError, PolicyStore, RouteRequest,
};

fn write(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_broken_file_keeps_the_old_policy_and_reports_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    write(&path, TWO_MODELS);
    let store = PolicyStore::open(&path).unwrap();
    let before = store.current();

    let broken = TWO_MODELS.replace("quality = 0.9", "quality = -3.0");
    write(&path, &broken);
    let err = store.reload_from_file().unwrap_err();
    let (line, col) = common::pos_of(&broken, "-3.0");
    assert_eq!(err.first_location(), Some((line, col)));
    assert!(
        err.to_string()
            .contains(&format!("policy.toml:{line}:{col}")),
        "{err}"
    );
    assert!(Arc::ptr_eq(&before, &store.current()), "old policy kept");
    assert_eq!(store.generation(), 1);
    assert!(store.last_error().is_some());
    assert_eq!(
        &*store.route(&request("good"), &IdleEngine).unwrap().model,
        "good"
    );

    write(
        &path,
        &TWO_MODELS.replace("name = \"good\"", "name = \"great\""),
    );
    store.reload_from_file().unwrap();
    assert_eq!(store.generation(), 2);
    assert!(store.last_error().is_none());
    assert!(store.route(&request("good"), &IdleEngine).is_err());
    assert_eq!(
        &*store.route(&request("great"), &IdleEngine).unwrap().model,
        "great"
    );
}

#[test]
fn unreadable_files_and_stores_without_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    write(&path, TWO_MODELS);
    let store = PolicyStore::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        store.reload_from_file(),
        Err(PolicyError::Read { .. })
    ));
    let plain = PolicyStore::new(common::policy(TWO_MODELS));
    assert!(matches!(plain.reload_from_file(), Err(PolicyError::NoFile)));
}

const BUDGETED: &str = r#"
[[models]]
name = "m"
version = "v1"
cost_per_1k_input = 0.0
cost_per_1k_output = 0.0
quality = 0.5
context_limit = 100000
[[tenants]]
name = "t"
[[tenants.budgets]]
window = "5200w"
limit_tokens = 1000
"#;

#[test]
fn reload_keeps_spend_and_takes_the_new_limit() {
    let store = PolicyStore::new(common::policy(BUDGETED));
    let mut req = RouteRequest::new(ModelHint::parse("m"), Caller::Tenant("t".into()));
    req.max_output_tokens = Some(600);
    let held = store.route(&req, &IdleEngine).unwrap();
    store
        .reload_from_str(&BUDGETED.replace("1000", "1500"), "new.toml")
        .unwrap();
    // 600 still reserved from before the reload; 1500 - 600 leaves room for one more.
    let second = store.route(&req, &IdleEngine).unwrap();
    assert!(store.route(&req, &IdleEngine).is_err());
    drop(held);
    drop(second);
    assert_eq!(
        store.current().budgets("t").unwrap()[0]
            .snapshot()
            .remaining,
        1500.0
    );
}

#[test]
fn reload_is_atomic_for_concurrent_readers() {
    let store = Arc::new(PolicyStore::new(common::policy(TWO_MODELS)));
    let renamed = TWO_MODELS.replace("name = \"cheap\"", "name = \"thrifty\"");
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    let p = store.current();
                    // Each snapshot is one whole policy: exactly one of the names exists.
                    assert!(p.model_index("cheap").is_some() != p.model_index("thrifty").is_some());
                    assert!(route(&p, &request("c"), &IdleEngine).is_ok());
                }
            })
        })
        .collect();
    for i in 0..50 {
        let src = if i % 2 == 0 { &renamed } else { TWO_MODELS };
        store.reload_from_str(src, "flip.toml").unwrap();
        assert!(store.reload_from_str("models = 3", "bad.toml").is_err());
    }
    for r in readers {
        r.join().unwrap();
    }
}

#[test]
fn the_watcher_reloads_on_change_and_survives_bad_edits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    write(&path, TWO_MODELS);
    let store = Arc::new(PolicyStore::open(&path).unwrap());
    let watcher = store.watch(Duration::from_millis(20)).unwrap();

    // The watcher looks every 20 ms; the deadline only guards against a hang (a loaded
    // machine can keep its thread off a core for seconds).
    let wait_for = |what: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !what() {
            assert!(Instant::now() < deadline, "watcher did not react in time");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    write(&path, "[[models]]\nname = 3\n");
    wait_for(&|| store.last_error().is_some());
    assert_eq!(store.generation(), 1);
    assert!(store.route(&request("good"), &IdleEngine).is_ok());

    write(
        &path,
        &TWO_MODELS.replace("name = \"good\"", "name = \"great\"  "),
    );
    wait_for(&|| store.generation() == 2);
    assert!(store.route(&request("great"), &IdleEngine).is_ok());
    drop(watcher);
}
