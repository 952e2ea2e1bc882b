//! Checkpoints that share most tensors run in one forward step: every
//! shared matrix multiplies all their rows at once, the differing ones run
//! per checkpoint, and each row's logits are exactly those of its own
//! checkpoint run alone.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/requests.rs"]
mod requests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::{KvBlocks, KvPool, SequenceKv};
use switchyard_engine::model::{
    forward_many, LlamaModel, LogitRows, ModelError, ModelPart, SequenceChunk,
};
use switchyard_engine::registry::Registry;
use switchyard_engine::repository::demo::{make_demo_repository, DemoOptions, DEFAULT_DERIVED};
use switchyard_engine::serving::{CheckpointId, Executor, ExecutorConfig, ExecutorObserver};
use switchyard_engine::store::WeightStore;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::KvPrefix;
use switchyard_kernels::{on_each_device, Backend, DType};
use tempfile::TempDir;

fn synthetic(dir: &Path, name: &str, preset: Preset, seed: u64) -> PathBuf {
    let path = dir.join(name);
    let spec = SyntheticSpec {
        preset,
        dtype: DType::Q4_1,
        seed,
    };
    write_gguf(&spec, &path).unwrap();
    path
}

/// The synthetic base, its Q8_0 re-quantization and three derived
/// checkpoints (a rank-4 delta on the last two `ffn_down`), all loaded
/// through one store.
struct Family<B: Backend> {
    base: LlamaModel<B>,
    requantized: LlamaModel<B>,
    derived: Vec<LlamaModel<B>>,
}

fn family<B: Backend>(dir: &Path, backend: &B, store: &WeightStore<B>) -> Family<B> {
    let base_path = synthetic(dir, "base.gguf", Preset::Smollm2, 7);
    let options = DemoOptions {
        base: base_path,
        out: dir.join("repo"),
        derived: DEFAULT_DERIVED,
    };
    let repo = make_demo_repository(&options, &mut |_| {}).unwrap();
    let mut models = repo.checkpoints.iter().map(|c| {
        let checkpoint = load_checkpoint(&c.path).unwrap();
        LlamaModel::load_shared(backend, &checkpoint, store)
            .unwrap()
            .0
    });
    let base = models.next().unwrap();
    let requantized = models.next().unwrap();
    Family {
        base,
        requantized,
        derived: models.collect(),
    }
}

const PROMPTS: [&[u32]; 4] = [
    &[1, 5, 9, 2, 44],
    &[7, 7, 3],
    &[4, 100, 200, 12, 33, 8],
    &[9],
];

/// A KV pool without a budget, F16 as the executor's default.
fn unlimited_kv<B: Backend>(backend: &B) -> Arc<KvBlocks<B>> {
    KvBlocks::new(backend, &KvPool::unlimited(switchyard_kernels::KvType::F16)).unwrap()
}

/// Logits of every token of `prompt` then of `decode` more greedy tokens,
/// run on `model` alone.
fn alone<B: Backend>(
    model: &LlamaModel<B>,
    backend: &B,
    prompt: &[u32],
    decode: usize,
) -> Vec<Vec<f32>> {
    let blocks = unlimited_kv(backend);
    let mut cache = SequenceKv::for_model(backend, &blocks, model, 64, KvPrefix::none()).unwrap();
    let mut scratch = model.new_scratch(backend);
    let mut chunks = [SequenceChunk {
        tokens: prompt,
        start_pos: 0,
        table: cache.prepare(backend, 0..prompt.len()).unwrap(),
        logits: LogitRows::All,
        prompt: true,
    }];
    let logits = model
        .forward(backend, &mut blocks.lock(), &mut chunks, &mut scratch)
        .unwrap();
    let vocab = model.config().vocab_size;
    let mut rows: Vec<Vec<f32>> = logits.chunks(vocab).map(<[f32]>::to_vec).collect();
    for position in prompt.len()..prompt.len() + decode {
        let next = [argmax(rows.last().unwrap())];
        let mut chunks = [SequenceChunk {
            tokens: &next,
            start_pos: position,
            table: cache.prepare(backend, position..position + 1).unwrap(),
            logits: LogitRows::Last,
            prompt: false,
        }];
        rows.push(
            model
                .forward(backend, &mut blocks.lock(), &mut chunks, &mut scratch)
                .unwrap()
                .to_vec(),
        );
    }
    rows
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn derived_checkpoints_share_steps_and_a_requantized_one_does_not<B: Backend>(backend: Arc<B>) {
    let dir = TempDir::new().unwrap();
    let backend = &*backend;
    let store = WeightStore::new();
    let f = family(dir.path(), backend, &store);
    for derived in &f.derived {
        assert!(f.base.shares_steps_with(derived));
        assert!(derived.shares_steps_with(&f.base));
    }
    assert!(f.derived[0].shares_steps_with(&f.derived[1]));
    assert!(!f.base.shares_steps_with(&f.requantized));
    let other = synthetic(dir.path(), "other.gguf", Preset::Llama, 7);
    let other = LlamaModel::load(backend, &load_checkpoint(&other).unwrap()).unwrap();
    assert!(!f.base.shares_steps_with(&other));
}

on_each_device!(
    derived_checkpoints_share_steps_and_a_requantized_one_does_not,
    threads = 1
);

/// Prefill then greedy decode of four sequences over three checkpoints in
/// shared steps, compared with each run alone: equal to the bit.
fn a_shared_step_gives_each_row_its_own_checkpoints_logits<B: Backend>(backend: Arc<B>) {
    let dir = TempDir::new().unwrap();
    let backend = &*backend;
    let store = WeightStore::new();
    let f = family(dir.path(), backend, &store);
    // Sequence i runs on owners[i]; the base appears twice, not adjacent.
    let owners: [&LlamaModel<B>; 4] = [&f.base, &f.derived[0], &f.derived[1], &f.base];
    const DECODE: usize = 6;
    let expected: Vec<Vec<Vec<f32>>> = owners
        .iter()
        .zip(PROMPTS)
        .map(|(m, p)| alone(m, backend, p, DECODE))
        .collect();

    let blocks = unlimited_kv(backend);
    let mut caches: Vec<_> = owners
        .iter()
        .map(|m| SequenceKv::for_model(backend, &blocks, m, 64, KvPrefix::none()).unwrap())
        .collect();
    let mut scratch = f.base.new_scratch(backend);
    let vocab = f.base.config().vocab_size;
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); owners.len()];
    let mut last: Vec<Vec<u32>> = PROMPTS.iter().map(|p| p.to_vec()).collect();
    let mut positions = vec![0usize; owners.len()];
    for step in 0..=DECODE {
        let mut chunks: Vec<SequenceChunk<'_>> = caches
            .iter_mut()
            .zip(&last)
            .zip(&positions)
            .map(|((cache, tokens), &start_pos)| SequenceChunk {
                tokens,
                start_pos,
                table: cache
                    .prepare(backend, start_pos..start_pos + tokens.len())
                    .unwrap(),
                logits: if step == 0 {
                    LogitRows::All
                } else {
                    LogitRows::Last
                },
                prompt: step == 0,
            })
            .collect();
        let (first, rest) = chunks.split_at_mut(1);
        let (second, rest) = rest.split_at_mut(1);
        let (third, fourth) = rest.split_at_mut(1);
        let mut parts = [
            ModelPart {
                model: owners[0],
                chunks: first,
                adapter: None,
            },
            ModelPart {
                model: owners[1],
                chunks: second,
                adapter: None,
            },
            ModelPart {
                model: owners[2],
                chunks: third,
                adapter: None,
            },
            ModelPart {
                model: owners[3],
                chunks: fourth,
                adapter: None,
            },
        ];
        let logits = forward_many(backend, &mut blocks.lock(), &mut parts, &mut scratch).unwrap();
        drop(chunks);
        let mut rows = logits.chunks(vocab);
        for (i, tokens) in last.iter_mut().enumerate() {
            let wanted = if step == 0 { tokens.len() } else { 1 };
            for _ in 0..wanted {
                got[i].push(rows.next().unwrap().to_vec());
            }
            positions[i] += tokens.len();
            *tokens = vec![argmax(got[i].last().unwrap())];
        }
        assert!(rows.next().is_none(), "more logits rows than asked");
    }
    for (i, (got, expected)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(got.len(), expected.len(), "sequence {i}");
        for (t, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!(
                g == e,
                "sequence {i} row {t}: the shared step's logits differ"
            );
        }
    }
    // The derived checkpoints do answer differently from the base, so the
    // equality above is not a base-only coincidence.
    let base_on_1 = alone(&f.base, backend, PROMPTS[1], 0);
    assert!(base_on_1 != expected[1][..PROMPTS[1].len()]);
}

on_each_device!(a_shared_step_gives_each_row_its_own_checkpoints_logits);

fn a_step_refuses_checkpoints_of_different_shapes<B: Backend>(backend: Arc<B>) {
    let dir = TempDir::new().unwrap();
    let backend = &*backend;
    let a = synthetic(dir.path(), "a.gguf", Preset::Smollm2, 1);
    let b = synthetic(dir.path(), "b.gguf", Preset::Llama, 1);
    let a = LlamaModel::load(backend, &load_checkpoint(&a).unwrap()).unwrap();
    let b = LlamaModel::load(backend, &load_checkpoint(&b).unwrap()).unwrap();
    let blocks = unlimited_kv(backend);
    let mut ca = SequenceKv::for_model(backend, &blocks, &a, 8, KvPrefix::none()).unwrap();
    let mut cb = SequenceKv::for_model(backend, &blocks, &b, 8, KvPrefix::none()).unwrap();
    let mut first = [SequenceChunk {
        tokens: &[1, 2],
        start_pos: 0,
        table: ca.prepare(backend, 0..2).unwrap(),
        logits: LogitRows::Last,
        prompt: true,
    }];
    let mut second = [SequenceChunk {
        tokens: &[3],
        start_pos: 0,
        table: cb.prepare(backend, 0..1).unwrap(),
        logits: LogitRows::Last,
        prompt: true,
    }];
    let mut parts = [
        ModelPart {
            model: &a,
            chunks: &mut first,
            adapter: None,
        },
        ModelPart {
            model: &b,
            chunks: &mut second,
            adapter: None,
        },
    ];
    let mut scratch = a.new_scratch(backend);
    let err = forward_many(backend, &mut blocks.lock(), &mut parts, &mut scratch).unwrap_err();
    assert!(
        matches!(err, ModelError::MixedArchitectures { .. }),
        "{err}"
    );
}

on_each_device!(a_step_refuses_checkpoints_of_different_shapes, threads = 1);

/// Counts the checkpoints' shares of steps (one call per checkpoint per step).
#[derive(Default)]
struct ShareCounter(AtomicU64);

impl ExecutorObserver for ShareCounter {
    fn step(&self, _: &CheckpointId, _: usize, _: usize, _: Duration) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// Clients hammer the base and its three derived checkpoints at once: the
/// executor runs them in shared steps, and every greedy output equals that
/// checkpoint's output run alone.
fn the_executor_runs_derived_checkpoints_together_without_mixing_them<B: Backend>(backend: Arc<B>) {
    const TOKENS: usize = 8;
    let dir = TempDir::new().unwrap();
    let base_path = synthetic(dir.path(), "base.gguf", Preset::Smollm2, 7);
    let options = DemoOptions {
        base: base_path,
        out: dir.path().join("repo"),
        derived: DEFAULT_DERIVED,
    };
    let repo = make_demo_repository(&options, &mut |_| {}).unwrap();
    let registry = Arc::new(Registry::new(backend.clone(), None));
    let mut names = Vec::new();
    // The base (version 1) and the three derived checkpoints; not the Q8_0 one.
    for c in repo.checkpoints.iter().filter(|c| c.version == "1") {
        registry.register(&c.model, &c.version, &c.path, &[]);
        registry.load(&c.model, &c.version).unwrap();
        registry.activate(&c.model, &c.version).unwrap();
        names.push(c.model.clone());
    }
    assert_eq!(names.len(), 4);
    let mut expected: HashMap<(String, usize), Vec<u32>> = HashMap::new();
    for name in &names {
        let checkpoint = registry.resolve(name).unwrap();
        for (p, prompt) in PROMPTS.iter().enumerate() {
            let rows = alone(&checkpoint.model, &*backend, prompt, TOKENS - 1);
            let ids = rows[prompt.len() - 1..].iter().map(|r| argmax(r)).collect();
            expected.insert((name.clone(), p), ids);
        }
    }
    let counter = Arc::new(ShareCounter::default());
    let executor = Arc::new(
        Executor::spawn(backend.clone(), ExecutorConfig::default(), counter.clone()).unwrap(),
    );
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let (registry, executor, expected, names) = (
                registry.clone(),
                executor.clone(),
                expected.clone(),
                names.clone(),
            );
            std::thread::spawn(move || {
                for i in 0..6 {
                    let name = &names[(client + i) % names.len()];
                    let p = (client * 3 + i) % PROMPTS.len();
                    let checkpoint = registry.resolve(name).unwrap();
                    let (request, receiver) = requests::on_channel(PROMPTS[p].to_vec(), TOKENS);
                    executor.submit(&checkpoint, request).unwrap();
                    let ids = requests::ids(&receiver);
                    assert_eq!(ids, expected[&(name.clone(), p)], "{name} prompt {p}");
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    let shares = counter.0.load(Ordering::Acquire);
    let steps = executor.steps();
    assert!(
        shares > steps + steps / 4,
        "{shares} checkpoint shares over {steps} steps: the checkpoints rarely shared a step"
    );
}

on_each_device!(the_executor_runs_derived_checkpoints_together_without_mixing_them);
