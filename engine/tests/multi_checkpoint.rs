//! One executor, many checkpoints and versions: no request ever mixes
//! weights, whatever is activated, rolled back or unloaded while it runs;
//! shared tensors are resident once; a bad version changes nothing.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/requests.rs"]
mod requests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use switchyard_engine::model::LogitRows;
use switchyard_engine::registry::{Registry, RegistryErrorKind, Tier};
use switchyard_engine::sampling::argmax;
use switchyard_engine::serving::{
    CheckpointId, Executor, ExecutorConfig, NoObserver, SequenceEvent,
};
use switchyard_engine::session::Session;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::{on_each_device, Backend, DType};

const MODELS: usize = 4;
const TOKENS: usize = 10;
const PROMPTS: [&[u32]; 3] = [&[1, 5, 9, 2], &[7, 7, 3], &[4, 100, 200, 12, 33, 8]];

fn write(dir: &Path, name: &str, preset: Preset, seed: u64) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    let spec = SyntheticSpec {
        preset,
        dtype: DType::Q8_0,
        seed,
    };
    write_gguf(&spec, &path).unwrap();
    path
}

/// Four models with two versions each (different weights), v1 active.
fn registry<B: Backend>(dir: &Path, backend: &Arc<B>) -> Arc<Registry<B>> {
    let registry = Arc::new(Registry::new(backend.clone(), None));
    for m in 0..MODELS {
        for v in 1..=2u64 {
            let name = format!("m{m}");
            let path = write(
                dir,
                &format!("m{m}-v{v}"),
                Preset::Smollm2,
                10 * v + m as u64,
            );
            registry.register(&name, &v.to_string(), &path, &[]);
            registry.load(&name, &v.to_string()).unwrap();
        }
        registry.activate(&format!("m{m}"), "1").unwrap();
    }
    registry
}

/// Greedy continuations of every prompt on `id`, run alone with a Session.
fn reference<B: Backend>(registry: &Registry<B>, backend: &B, id: &CheckpointId) -> Vec<Vec<u32>> {
    let checkpoint = registry.resolve(&id.to_string()).unwrap();
    PROMPTS
        .iter()
        .map(|prompt| {
            let mut session =
                Session::new(backend, &checkpoint.model, prompt.len() + TOKENS).unwrap();
            let mut logits = session.feed(prompt, LogitRows::Last).unwrap();
            let mut ids = Vec::new();
            for _ in 0..TOKENS {
                let id = argmax(&logits);
                ids.push(id);
                logits = session.decode(&[id], LogitRows::Last).unwrap();
            }
            ids
        })
        .collect()
}

fn no_request_mixes_weights_while_versions_flip_under_load<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(dir.path(), &backend);
    let mut expected: HashMap<CheckpointId, Vec<Vec<u32>>> = HashMap::new();
    for m in 0..MODELS {
        for v in ["1", "2"] {
            let id = CheckpointId::new(format!("m{m}"), v);
            expected.insert(id.clone(), reference(&registry, &*backend, &id));
        }
    }
    // The versions really differ, or the test would prove nothing.
    assert_ne!(
        expected[&CheckpointId::new("m0", "1")],
        expected[&CheckpointId::new("m0", "2")]
    );
    let executor = Arc::new(
        Executor::spawn(
            backend.clone(),
            ExecutorConfig::default(),
            Arc::new(NoObserver),
        )
        .unwrap(),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (registry, stop) = (registry.clone(), stop.clone());
        std::thread::spawn(move || {
            // Forty flips, every few milliseconds, while clients keep sending.
            for flips in 0..40 {
                let model = format!("m{}", flips % MODELS);
                // A rollback with no earlier version left is refused; flip instead.
                if flips % 3 != 2 || registry.rollback(&model).is_err() {
                    let to = if flips % 2 == 0 { "2" } else { "1" };
                    registry.activate(&model, to).unwrap();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.store(true, Ordering::Release);
        })
    };
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let (registry, executor, expected, stop) = (
                registry.clone(),
                executor.clone(),
                expected.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                let mut i = 0;
                while i < 10 || !stop.load(Ordering::Acquire) {
                    let model = format!("m{}", (client + i) % MODELS);
                    // Every third request names its version explicitly.
                    let spec = if i % 3 == 0 {
                        format!("{model}@2")
                    } else {
                        model
                    };
                    let prompt_index = (client * 7 + i) % PROMPTS.len();
                    let checkpoint = registry.resolve(&spec).unwrap();
                    let (req, rx) = requests::on_channel(PROMPTS[prompt_index].to_vec(), TOKENS);
                    executor.submit(&checkpoint, req).unwrap();
                    let ids = requests::ids(&rx);
                    assert_eq!(
                        ids, expected[&checkpoint.id][prompt_index],
                        "client {client} request {i} on {} mixed weights",
                        checkpoint.id
                    );
                    i += 1;
                }
                i
            })
        })
        .collect();
    let requests: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    flipper.join().unwrap();
    assert!(requests >= 80);
    assert!(executor.swaps() > 10, "only {} swaps", executor.swaps());
}

on_each_device!(no_request_mixes_weights_while_versions_flip_under_load);

fn a_stream_survives_activation_rollback_and_unload_of_its_version<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(dir.path(), &backend);
    let id = CheckpointId::new("m1", "2");
    let expected = reference(&registry, &*backend, &id);
    let executor = Executor::spawn(
        backend.clone(),
        ExecutorConfig::default(),
        Arc::new(NoObserver),
    )
    .unwrap();
    let ram_before = registry.memory().ram_bytes;

    registry.activate("m1", "2").unwrap();
    let checkpoint = registry.resolve("m1").unwrap();
    assert_eq!(checkpoint.id, id);
    // A one-slot sink makes the executor wait for us between tokens, so
    // the lifecycle calls below happen while the stream is mid-way.
    let (req, receiver) = requests::on_one_slot(PROMPTS[2].to_vec(), Some(TOKENS));
    executor.submit(&checkpoint, req).unwrap();
    drop(checkpoint);
    let mut ids = Vec::new();
    let mut step = 0;
    loop {
        match receiver.recv_timeout(Duration::from_secs(60)).unwrap() {
            SequenceEvent::Token(token) => ids.push(token.id),
            SequenceEvent::Done { .. } => break,
            SequenceEvent::Error(message) => panic!("the stream failed: {message}"),
            SequenceEvent::Embedding { .. } => panic!("a generation reported an embedding"),
        }
        match step {
            1 => assert_eq!(registry.rollback("m1").unwrap(), ("2".into(), "1".into())),
            2 => registry.activate("m1", "2").map(drop).unwrap(),
            3 => registry.activate("m1", "1").map(drop).unwrap(),
            4 => assert_eq!(
                registry.unload("m1", "2").unwrap(),
                1,
                "the stream still holds it"
            ),
            _ => {}
        }
        step += 1;
    }
    assert_eq!(ids, expected[2], "the stream changed weights mid-way");
    // Its last user gone, the unloaded version's bytes leave RAM, on the executor's
    // thread and its own time: polled, with a deadline that only guards against a hang.
    let deadline = std::time::Instant::now() + requests::EVENT_WAIT;
    while registry.memory().ram_bytes >= ram_before && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(registry.memory().ram_bytes < ram_before);
    assert_eq!(
        registry.resolve("m1@2").err().map(|e| e.kind),
        Some(RegistryErrorKind::Conflict)
    );
}

on_each_device!(a_stream_survives_activation_rollback_and_unload_of_its_version);

fn checkpoints_that_share_tensors_are_resident_once<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "base", Preset::Smollm2, 3);
    let registry = Registry::new(backend, None);
    registry.register("a", "1", &path, &[]);
    registry.register("b", "1", &path, &[]);
    let first = registry.load("a", "1").unwrap();
    let one_copy = registry.memory().ram_bytes;
    let second = registry.load("b", "1").unwrap();
    assert_eq!(first.shared_bytes, 0);
    assert_eq!(second.shared_bytes, second.bytes, "every tensor is shared");
    let memory = registry.memory();
    assert_eq!(memory.ram_bytes, one_copy);
    assert_eq!(memory.ram_bytes_without_sharing, 2 * first.bytes);
}

on_each_device!(
    checkpoints_that_share_tensors_are_resident_once,
    threads = 1
);

fn corrupt_or_mismatched_versions_never_become_active<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good", Preset::Smollm2, 3);
    let corrupt = dir.path().join("corrupt.gguf");
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&corrupt, &bytes[..bytes.len() / 2]).unwrap();
    let other_shape = write(dir.path(), "llama", Preset::Llama, 3);

    let registry = Registry::new(backend, None);
    registry.register("m", "1", &good, &[]);
    registry.register("m", "2", &corrupt, &[]);
    registry.register("m", "3", &other_shape, &[]);
    registry.load("m", "1").unwrap();
    registry.activate("m", "1").unwrap();

    let error = registry.load("m", "2").unwrap_err();
    assert_eq!(error.kind, RegistryErrorKind::Invalid);
    assert!(error.message.contains("corrupt.gguf"), "{}", error.message);
    let error = registry.load("m", "3").unwrap_err();
    assert_eq!(error.kind, RegistryErrorKind::Invalid);
    assert!(
        error.message.contains("does not match"),
        "{}",
        error.message
    );
    for version in ["2", "3"] {
        assert_eq!(
            registry.activate("m", version).unwrap_err().kind,
            RegistryErrorKind::Conflict
        );
    }
    assert_eq!(
        registry.resolve("m").unwrap().id,
        CheckpointId::new("m", "1")
    );
    let status = registry.status();
    let versions = &status[0].versions;
    assert!(versions[1]
        .last_error
        .as_deref()
        .unwrap_or("")
        .contains("corrupt.gguf"));
    assert_eq!(
        registry.unload("m", "1").unwrap_err().kind,
        RegistryErrorKind::Conflict
    );
}

on_each_device!(
    corrupt_or_mismatched_versions_never_become_active,
    threads = 1
);

fn a_ram_budget_evicts_the_idle_version_not_the_active_one<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<_> = (0..3)
        .map(|i| write(dir.path(), &format!("v{i}"), Preset::Smollm2, 40 + i))
        .collect();
    let probe = Registry::new(backend.clone(), None);
    probe.register("p", "1", &paths[0], &[]);
    let one = probe.load("p", "1").unwrap().bytes;
    let file = std::fs::metadata(&paths[0]).unwrap().len();
    drop(probe);

    // Room for two versions, not three.
    let registry = Registry::new(backend, Some(one + file + file / 2));
    for (i, path) in paths.iter().enumerate() {
        registry.register("m", &(i + 1).to_string(), path, &[]);
    }
    registry.load("m", "1").unwrap();
    registry.activate("m", "1").unwrap();
    registry.load("m", "2").unwrap();
    let report = registry.load("m", "3").unwrap();
    assert_eq!(report.evicted, vec![CheckpointId::new("m", "2")]);
    assert_eq!(
        registry.resolve("m").unwrap().id,
        CheckpointId::new("m", "1")
    );
    assert!(registry.resolve("m@3").is_ok());
}

on_each_device!(
    a_ram_budget_evicts_the_idle_version_not_the_active_one,
    threads = 1
);

fn routing_state_reports_tier_bytes_and_queue<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "base", Preset::Smollm2, 3);
    let file_bytes = std::fs::metadata(&path).unwrap().len();
    let registry = Registry::new(backend, None);
    registry.register("a", "1", &path, &[]);
    registry.register("a", "2", &path, &[]);
    let live = registry.live("a", "1").unwrap();
    assert!(registry.live("a", "3").is_none());
    assert_eq!(live.routing_state().tier, Tier::Disk);
    let on_disk = registry.routing_state("a", Some("1")).unwrap();
    assert_eq!(
        (on_disk.tier, on_disk.bytes, on_disk.queued),
        (Tier::Disk, file_bytes, 0)
    );
    // No active version yet, and unknown names: nothing to report.
    assert_eq!(registry.routing_state("a", None), None);
    assert_eq!(registry.routing_state("a", Some("3")), None);
    assert_eq!(registry.routing_state("b", Some("1")), None);
    let loaded = registry.load("a", "1").unwrap();
    registry.activate("a", "1").unwrap();
    let resident = registry.routing_state("a", None).unwrap();
    assert_eq!(
        (resident.tier, resident.bytes, resident.queued),
        (Tier::Ram, loaded.bytes, 0)
    );
    assert_eq!(
        registry.routing_state("a", Some("2")).unwrap().tier,
        Tier::Disk
    );
    // The live slot taken while on disk follows the version through load and unload.
    assert_eq!(live.routing_state(), resident);
    registry.load("a", "2").unwrap();
    registry.activate("a", "2").unwrap();
    registry.unload("a", "1").unwrap();
    assert_eq!(live.routing_state(), on_disk);
}

on_each_device!(routing_state_reports_tier_bytes_and_queue, threads = 1);
