//! Where the tests find the real test models. They are part of the test set-up
//! (`scripts/setup.sh` fetches them, and CI runs it), so a missing file fails the
//! test that needs it with the command that fetches it, rather than letting the
//! test pass without checking anything.
//!
//! One home for every test crate of the workspace: the root package's tests
//! include this file with `#[path]`.

#![allow(dead_code)]

use std::path::PathBuf;

/// SmolLM2-135M-Instruct Q4_1: `SWITCHYARD_MODEL`, or the fetch script's cache.
pub fn smollm2() -> PathBuf {
    real_model(
        "SWITCHYARD_MODEL",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "scripts/fetch-model.sh",
    )
}

/// Gemma 3 270M Q4_K_M: `SWITCHYARD_GEMMA3`, or the fetch script's cache.
pub fn gemma3() -> PathBuf {
    real_model(
        "SWITCHYARD_GEMMA3",
        "gemma-3-270m-q4_k_m.gguf",
        "scripts/fetch-gemma3.sh",
    )
}

fn real_model(env: &str, file: &str, fetch: &str) -> PathBuf {
    let path = match std::env::var_os(env) {
        Some(path) => PathBuf::from(path),
        None => cache_dir().join("models").join(file),
    };
    assert!(
        path.is_file(),
        "the real test model {} is missing: run {fetch} (or scripts/setup.sh), or set {env}",
        path.display()
    );
    path
}

/// `SWITCHYARD_CACHE`, else `~/.cache/switchyard`, as the fetch scripts choose.
fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SWITCHYARD_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").expect("HOME is set (the fetch scripts cache under it)");
    PathBuf::from(home).join(".cache/switchyard")
}
