//! The engine's side of the backend's residency tiers (issue 34): the
//! registry demotes an evicted version to the backend's host tier (then
//! disk), status and routing say `host`, and the executor prefetches the
//! checkpoint its queue needs next while another batch runs, running it
//! only once its copy has landed. The backend is each compiled one behind
//! a wrapper with a host tier (`support/tiered_backend.rs`).
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/requests.rs"]
mod requests;

#[path = "support/tiered_backend.rs"]
mod tiered_backend;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard_engine::chat::ChatTemplate;
use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::model::LlamaModel;
use switchyard_engine::registry::{Registry, Tier};
use switchyard_engine::serving::{
    CheckpointHandle, CheckpointId, Executor, ExecutorConfig, NoObserver, ServedCheckpoint,
};
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::{on_each_device, Backend, DType, WeightTier};
use tiered_backend::{Event, Tiered};

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

fn serve<B: Backend>(backend: &B, path: &Path, version: &str) -> CheckpointHandle<B> {
    let checkpoint = load_checkpoint(path).unwrap();
    let model = LlamaModel::load(backend, &checkpoint).unwrap();
    let tokenizer = Tokenizer::load(&checkpoint.tokenizer).unwrap();
    Arc::new(ServedCheckpoint::from_parts(
        CheckpointId::new("m", version),
        model,
        tokenizer,
        ChatTemplate::new_or_default(None).unwrap(),
        path,
        checkpoint.format,
    ))
}

/// The id the wrapper gives `checkpoint`'s first matrix (its embedding).
fn first_matrix<B: Backend>(checkpoint: &CheckpointHandle<Tiered<B>>) -> u64 {
    checkpoint.model.weight_matrices()[0].id
}

/// A demoted checkpoint with a request waiting is prefetched once, while
/// another checkpoint's batch keeps stepping, and runs only after its copy
/// landed, generating what it generated before the demotion.
fn the_queued_checkpoint_is_prefetched_while_another_batch_runs<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let tiered = Arc::new(Tiered::new(backend, u64::MAX));
    let a = serve(&*tiered, &write(dir.path(), "a", 1), "1");
    let b = serve(&*tiered, &write(dir.path(), "b", 2), "2");
    let (a_id, b_id) = (first_matrix(&a), first_matrix(&b));
    let exec = Executor::spawn(
        tiered.clone(),
        ExecutorConfig::default(),
        Arc::new(NoObserver),
    )
    .unwrap();
    let prompt = vec![1, 2, 3, 4, 5];
    let (request, events) = requests::on_channel(prompt.clone(), 6);
    exec.submit(&a, request).unwrap();
    let before = requests::ids(&events);

    // The registry's eviction, as it asks the backend.
    assert!(tiered.demote(&a.model.unshared_matrices()).unwrap());
    assert_eq!(
        tiered.weight_tier(&a.model.weight_matrices()),
        WeightTier::Host
    );
    tiered.take_events();

    // B's long batch first, then a request for A.
    let (request, b_events) = requests::on_channel(vec![9, 8, 7], 24);
    exec.submit(&b, request).unwrap();
    let (request, a_events) = requests::on_channel(prompt, 6);
    exec.submit(&a, request).unwrap();
    let after = requests::ids(&a_events);
    requests::ids(&b_events);
    assert_eq!(after, before, "A after its round trip through host memory");
    assert_eq!(a.placement(), WeightTier::Resident);

    let events = tiered.take_events();
    let prefetches: Vec<usize> = (0..events.len())
        .filter(|&i| events[i] == Event::Prefetch(a_id))
        .collect();
    assert_eq!(prefetches.len(), 1, "one copy up: {events:?}");
    let first_a_step = events.iter().position(|e| *e == Event::Step(a_id)).unwrap();
    assert!(prefetches[0] < first_a_step, "{events:?}");
    let b_steps_meanwhile = events[prefetches[0]..first_a_step]
        .iter()
        .filter(|e| **e == Event::Step(b_id))
        .count();
    assert!(
        b_steps_meanwhile >= 1,
        "B's batch ran while A copied up: {events:?}"
    );
    exec.shutdown();
}

on_each_device!(
    the_queued_checkpoint_is_prefetched_while_another_batch_runs,
    threads = 1
);

fn version_tier<B: Backend>(registry: &Registry<B>, version: &str) -> Tier {
    registry.status()[0]
        .versions
        .iter()
        .find(|v| v.version == version)
        .unwrap()
        .tier
}

/// A registry over three versions of `m` with device memory for two and
/// `host_budget` bytes of host tier; 1 active, 2 loaded, then 3 loaded.
fn evicting<B: Backend>(backend: Arc<B>, dir: &Path, host_budget: u64) -> Registry<Tiered<B>> {
    let paths: Vec<_> = (0..3)
        .map(|i| write(dir, &format!("v{i}"), 60 + i))
        .collect();
    let tiered = Arc::new(Tiered::new(backend, host_budget));
    let probe = Registry::new(tiered.clone(), None);
    probe.register("p", "1", &paths[0], &[]);
    let one = probe.load("p", "1").unwrap().bytes;
    let file = std::fs::metadata(&paths[0]).unwrap().len();
    drop(probe);
    let registry = Registry::new(tiered, Some(one + file + file / 2));
    for (i, path) in paths.iter().enumerate() {
        registry.register("m", &(i + 1).to_string(), path, &[]);
    }
    registry.load("m", "1").unwrap();
    registry.activate("m", "1").unwrap();
    registry.load("m", "2").unwrap();
    let report = registry.load("m", "3").unwrap();
    assert_eq!(report.evicted, vec![CheckpointId::new("m", "2")]);
    registry
}

/// Evicted from the device, a version goes to the host tier when it has
/// room (loaded, `host` in status and routing, still resolvable), else to
/// disk.
fn an_evicted_version_goes_to_the_host_tier_then_disk<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let registry = evicting(backend.clone(), dir.path(), u64::MAX);
    assert_eq!(version_tier(&registry, "2"), Tier::Host);
    assert_eq!(version_tier(&registry, "1"), Tier::Device);
    assert_eq!(
        registry.routing_state("m", Some("2")).unwrap().tier,
        Tier::Host
    );
    let memory = registry.memory();
    assert_eq!((memory.host_versions, memory.resident_versions), (1, 2));
    assert!(memory.host_bytes > 0);
    let handle = registry.resolve("m@2").unwrap();
    assert_eq!(handle.placement(), WeightTier::Host);
    assert_eq!(
        registry
            .backend()
            .weight_tier(&handle.model.weight_matrices()),
        WeightTier::Host
    );

    // No room in the host tier: disk, as on a backend without one.
    let dir = tempfile::tempdir().unwrap();
    let registry = evicting(backend, dir.path(), 0);
    assert_eq!(version_tier(&registry, "2"), Tier::Disk);
    assert_eq!(registry.memory().host_bytes, 0);
}

on_each_device!(
    an_evicted_version_goes_to_the_host_tier_then_disk,
    threads = 1
);
