//! Issue 17, case 5: under a RAM budget a load checks the file before it evicts
//! anything, and never evicts the version a rollback would return to.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard_engine::registry::{Registry, RegistryErrorKind, Tier};
use switchyard_engine::serving::CheckpointId;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::{on_each_device, Backend, DType};

fn write(dir: &Path, name: &str, seed: u64) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q8_0,
        seed,
    };
    write_gguf(&spec, &path).unwrap();
    path
}

/// A registry over three versions of `m` with RAM for two of them.
fn budgeted<B: Backend>(backend: Arc<B>, dir: &Path, third: &Path) -> Registry<B> {
    let paths: Vec<_> = (0..2)
        .map(|i| write(dir, &format!("v{i}"), 40 + i))
        .collect();
    let probe = Registry::new(backend.clone(), None);
    probe.register("p", "1", &paths[0], &[]);
    let one = probe.load("p", "1").unwrap().bytes;
    let file = std::fs::metadata(&paths[0]).unwrap().len();
    drop(probe);
    let registry = Registry::new(backend, Some(one + file + file / 2));
    registry.register("m", "1", &paths[0], &[]);
    registry.register("m", "2", &paths[1], &[]);
    registry.register("m", "3", third, &[]);
    registry
}

fn tier<B: Backend>(registry: &Registry<B>, version: &str) -> Tier {
    registry.status()[0]
        .versions
        .iter()
        .find(|v| v.version == version)
        .unwrap()
        .tier
}

fn a_corrupt_version_evicts_nothing<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good", 7);
    let corrupt = dir.path().join("corrupt.gguf");
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&corrupt, &bytes[..bytes.len() / 2]).unwrap();
    let registry = budgeted(backend, dir.path(), &corrupt);
    registry.load("m", "1").unwrap();
    registry.activate("m", "1").unwrap();
    registry.load("m", "2").unwrap();

    let error = registry.load("m", "3").unwrap_err();
    assert_eq!(error.kind, RegistryErrorKind::Invalid);
    assert!(error.message.contains("corrupt.gguf"), "{}", error.message);
    // Version 2 used to be evicted before the corrupt file was even read.
    assert_eq!(tier(&registry, "2"), Tier::Ram);
    assert_eq!(tier(&registry, "3"), Tier::Disk);
    assert!(registry.resolve("m@2").is_ok());
}

on_each_device!(a_corrupt_version_evicts_nothing, threads = 1);

fn the_rollback_target_is_never_evicted<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let third = write(dir.path(), "v2", 42);
    let registry = budgeted(backend, dir.path(), &third);
    registry.load("m", "1").unwrap();
    registry.activate("m", "1").unwrap();
    registry.load("m", "2").unwrap();
    registry.activate("m", "2").unwrap();

    // Room for two: the only idle version is 1, which a rollback returns to.
    let error = registry.load("m", "3").unwrap_err();
    assert_eq!(
        error.kind,
        RegistryErrorKind::Unavailable,
        "{}",
        error.message
    );
    assert_eq!(tier(&registry, "1"), Tier::Ram);
    // The rollback still works (it answered 409 once 1 had been evicted).
    assert_eq!(
        registry.rollback("m").unwrap(),
        ("2".to_owned(), "1".to_owned())
    );
    assert_eq!(
        registry.resolve("m").unwrap().id,
        CheckpointId::new("m", "1")
    );
    // A rollback leaves no earlier version to return to: 2 is idle and goes.
    let report = registry.load("m", "3").unwrap();
    assert_eq!(report.evicted, vec![CheckpointId::new("m", "2")]);
}

on_each_device!(the_rollback_target_is_never_evicted, threads = 1);
