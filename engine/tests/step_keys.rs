//! The engine's side of recorded steps (CUDA graphs): a forward step is
//! opened with a key that is the same for every decode step of one
//! checkpoint and batch shape, and a keyed step the backend reports as
//! diverged from its recording is run again without a key, giving the
//! same logits to the bit.
//!
//! The backend here is each compiled one behind a wrapper that records the keys
//! and answers `StepDiverged` at the end of every other keyed step, as
//! the CUDA backend does when a replay's calls differ from its capture.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::ops::Range;
use std::sync::{Arc, Mutex};

use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::{KvBlocks, KvPool, SequenceKv};
use switchyard_engine::model::{LlamaModel, LogitRows, SequenceChunk};
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::kv::{BlockId, KvBlockShape};
use switchyard_kernels::{
    on_each_device, AttentionRows, AttentionShape, Backend, DType, KernelError, KvFormat, KvPrefix,
    KvType, LoraRows, MatmulInput, MatmulProduct, RopeStyle, StepKey, WeightView,
};
use tempfile::TempDir;

/// What the wrapper saw of one step.
#[derive(Clone, Debug, PartialEq)]
enum Event {
    Begin(Option<StepKey>),
    End,
    Abort,
}

struct Diverging<B: Backend> {
    inner: Arc<B>,
    events: Mutex<Vec<Event>>,
    /// Keyed steps ended so far; every odd one is refused.
    keyed_ends: Mutex<usize>,
    key: Mutex<Option<StepKey>>,
}

fn input<B: Backend>(m: MatmulInput<'_, Diverging<B>>) -> MatmulInput<'_, B> {
    match m {
        MatmulInput::Rows(x) => MatmulInput::Rows(x),
        MatmulInput::RmsNorm {
            x,
            weight,
            eps,
            out,
        } => MatmulInput::RmsNorm {
            x,
            weight,
            eps,
            out,
        },
        MatmulInput::SiluMul { gate, up } => MatmulInput::SiluMul { gate, up },
        MatmulInput::GeluMul { gate, up } => MatmulInput::GeluMul { gate, up },
    }
}

impl<B: Backend> Backend for Diverging<B> {
    type Matrix = B::Matrix;
    type Vector = B::Vector;
    type Activations = B::Activations;
    type KvStore = B::KvStore;

    fn name(&self) -> String {
        format!("diverging-{}", self.inner.name())
    }
    fn matrix(&self, weight: WeightView) -> Result<Self::Matrix, KernelError> {
        self.inner.matrix(weight)
    }
    fn vector(&self, values: &[f32]) -> Result<Self::Vector, KernelError> {
        self.inner.vector(values)
    }
    fn activations(&self, rows: usize, cols: usize) -> Self::Activations {
        self.inner.activations(rows, cols)
    }
    fn host_rows<'a>(&self, x: &'a Self::Activations, staging: &'a mut Vec<f32>) -> &'a [f32] {
        self.inner.host_rows(x, staging)
    }
    fn resize(&self, x: &mut Self::Activations, rows: usize, cols: usize) {
        self.inner.resize(x, rows, cols)
    }
    fn kv_store(&self, format: KvFormat, budget: usize) -> Result<Self::KvStore, KernelError> {
        self.inner.kv_store(format, budget)
    }
    fn kv_alloc(&self, s: &mut Self::KvStore, shape: KvBlockShape) -> Result<BlockId, KernelError> {
        self.inner.kv_alloc(s, shape)
    }
    fn kv_free(store: &mut Self::KvStore, id: BlockId) {
        B::kv_free(store, id)
    }
    fn kv_copy(
        &self,
        s: &mut Self::KvStore,
        from: BlockId,
        to: BlockId,
        positions: usize,
    ) -> Result<(), KernelError> {
        self.inner.kv_copy(s, from, to, positions)
    }
    fn begin_step(&self, key: Option<StepKey>) {
        self.events.lock().unwrap().push(Event::Begin(key));
        *self.key.lock().unwrap() = key;
    }
    fn end_step(&self) -> Result<(), KernelError> {
        self.events.lock().unwrap().push(Event::End);
        if self.key.lock().unwrap().is_some() {
            let mut n = self.keyed_ends.lock().unwrap();
            *n += 1;
            if *n % 2 == 1 {
                return Err(KernelError::StepDiverged("refused by the test".into()));
            }
        }
        Ok(())
    }
    fn abort_step(&self) {
        self.events.lock().unwrap().push(Event::Abort);
    }
    fn embed(
        &self,
        t: &Self::Matrix,
        tokens: &[u32],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.embed(t, tokens, out)
    }
    fn rms_norm(
        &self,
        x: &Self::Activations,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.rms_norm(x, w, eps, out)
    }
    fn matmul(
        &self,
        x: &Self::Activations,
        w: &Self::Matrix,
        bias: Option<&Self::Vector>,
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.matmul(x, w, bias, out)
    }
    fn matmul_many(
        &self,
        x: MatmulInput<'_, Self>,
        products: &mut [MatmulProduct<'_, Self>],
    ) -> Result<(), KernelError> {
        let mut own: Vec<MatmulProduct<'_, B>> = products
            .iter_mut()
            .map(|p| MatmulProduct {
                w: p.w,
                bias: p.bias,
                out: &mut *p.out,
                accumulate: p.accumulate,
            })
            .collect();
        self.inner.matmul_many(input(x), &mut own)
    }
    fn rope(
        &self,
        x: &mut Self::Activations,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        style: RopeStyle,
    ) -> Result<(), KernelError> {
        self.inner.rope(x, head_dim, positions, inv_freq, style)
    }
    fn attention(
        &self,
        layer: usize,
        shape: AttentionShape,
        q: &Self::Activations,
        k: &Self::Activations,
        v: &Self::Activations,
        store: &mut Self::KvStore,
        seqs: &[AttentionRows<'_>],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner
            .attention(layer, shape, q, k, v, store, seqs, out)
    }
    fn silu_mul(
        &self,
        g: &mut Self::Activations,
        u: &Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.silu_mul(g, u)
    }
    fn gelu_mul(
        &self,
        g: &mut Self::Activations,
        u: &Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.gelu_mul(g, u)
    }
    fn scale(&self, x: &mut Self::Activations, factor: f32) -> Result<(), KernelError> {
        self.inner.scale(x, factor)
    }
    fn softcap(&self, x: &mut Self::Activations, cap: f32) -> Result<(), KernelError> {
        self.inner.softcap(x, cap)
    }
    fn rms_norm_heads(
        &self,
        x: &mut Self::Activations,
        w: &Self::Vector,
        eps: f32,
    ) -> Result<(), KernelError> {
        self.inner.rms_norm_heads(x, w, eps)
    }
    fn add(&self, x: &mut Self::Activations, y: &Self::Activations) -> Result<(), KernelError> {
        self.inner.add(x, y)
    }
    fn lora(
        &self,
        x: &Self::Activations,
        runs: &[LoraRows<'_, Self>],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        let own: Vec<LoraRows<'_, B>> = runs
            .iter()
            .map(|r| LoraRows {
                rows: r.rows.clone(),
                a: r.a,
                b_t: r.b_t,
                scale: r.scale,
            })
            .collect();
        self.inner.lora(x, &own, out)
    }
    fn copy_rows(
        &self,
        src: &Self::Activations,
        rows: Range<usize>,
        dst: &mut Self::Activations,
        dst_row: usize,
    ) -> Result<(), KernelError> {
        self.inner.copy_rows(src, rows, dst, dst_row)
    }
}

/// Logits of a prompt then `decode` greedy steps of `model` on `backend`.
fn run<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    prompt: &[u32],
    decode: usize,
) -> Vec<Vec<f32>> {
    let blocks = KvBlocks::new(backend, &KvPool::unlimited(KvType::F16)).unwrap();
    let mut cache = SequenceKv::for_model(backend, &blocks, model, 64, KvPrefix::none()).unwrap();
    let mut scratch = model.new_scratch(backend);
    let mut rows = Vec::new();
    let mut tokens = prompt.to_vec();
    let mut start = 0;
    for _ in 0..=decode {
        let mut chunks = [SequenceChunk {
            tokens: &tokens,
            start_pos: start,
            table: cache.prepare(backend, start..start + tokens.len()).unwrap(),
            logits: LogitRows::Last,
            prompt: start == 0,
        }];
        let logits = model
            .forward(backend, &mut blocks.lock(), &mut chunks, &mut scratch)
            .unwrap()
            .to_vec();
        start += tokens.len();
        let next = (0..logits.len())
            .max_by(|a, b| logits[*a].total_cmp(&logits[*b]))
            .unwrap() as u32;
        rows.push(logits);
        tokens = vec![next];
    }
    rows
}

on_each_device!(
    decode_steps_share_a_key_and_a_diverged_step_runs_again_unkeyed,
    threads = 1
);
fn decode_steps_share_a_key_and_a_diverged_step_runs_again_unkeyed<B: Backend>(backend: Arc<B>) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("m.gguf");
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q8_0,
        seed: 3,
    };
    write_gguf(&spec, &path).unwrap();
    let checkpoint = load_checkpoint(&path).unwrap();
    let plain = LlamaModel::load(&*backend, &checkpoint).unwrap();
    // A prompt longer than a keyed chunk, then six decode steps.
    let prompt: Vec<u32> = (1..=20).collect();
    let expected = run(&*backend, &plain, &prompt, 6);

    let wrapped = Arc::new(Diverging {
        inner: backend.clone(),
        events: Mutex::default(),
        keyed_ends: Mutex::default(),
        key: Mutex::default(),
    });
    let model = LlamaModel::load(&*wrapped, &checkpoint).unwrap();
    let got = run(&*wrapped, &model, &prompt, 6);
    assert_eq!(got, expected, "a rerun step's logits differ");

    let events = wrapped.events.lock().unwrap().clone();
    let begins: Vec<Option<StepKey>> = events
        .iter()
        .filter_map(|e| match e {
            Event::Begin(k) => Some(*k),
            _ => None,
        })
        .collect();
    // The prompt: no key. Each decode step: its key, and every other one
    // refused then run again without it.
    assert_eq!(begins[0], None);
    let keys: Vec<StepKey> = begins.iter().flatten().copied().collect();
    assert_eq!(keys.len(), 6);
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
    let reruns = begins.iter().filter(|k| k.is_none()).count() - 1;
    assert_eq!(reruns, 3);
    let aborts = events.iter().filter(|e| **e == Event::Abort).count();
    assert_eq!(aborts, 3);
    // Each refused step: begin(key), end (refused), abort, begin(None), end.
    let refused = events
        .windows(5)
        .filter(|w| {
            matches!(
                w,
                [
                    Event::Begin(Some(_)),
                    Event::End,
                    Event::Abort,
                    Event::Begin(None),
                    Event::End
                ]
            )
        })
        .count();
    assert_eq!(refused, 3);
}

/// The keys of `model`'s decode steps on a recording backend.
fn decode_keys<B: Backend>(
    backend: &Arc<B>,
    checkpoint: &switchyard_engine::formats::Checkpoint,
) -> Vec<StepKey> {
    let wrapped = Diverging {
        inner: Arc::clone(backend),
        events: Mutex::default(),
        keyed_ends: Mutex::default(),
        key: Mutex::default(),
    };
    let model = LlamaModel::load(&wrapped, checkpoint).unwrap();
    run(&wrapped, &model, &[1, 2, 3], 2);
    let events = wrapped.events.lock().unwrap().clone();
    events
        .iter()
        .filter_map(|e| match e {
            Event::Begin(Some(k)) => Some(*k),
            _ => None,
        })
        .collect()
}

/// Two checkpoints of the same shapes (other weights) share their decode
/// key, so a GPU backend replays one captured graph for both, swapping
/// the weights it reads; another type or architecture gets another key.
fn checkpoints_of_one_shape_share_a_decode_key<B: Backend>(backend: Arc<B>) {
    let dir = TempDir::new().unwrap();
    let load = |preset, dtype, seed: u64| {
        let path = dir.path().join(format!("{preset:?}-{dtype:?}-{seed}.gguf"));
        let spec = SyntheticSpec {
            preset,
            dtype,
            seed,
        };
        write_gguf(&spec, &path).unwrap();
        load_checkpoint(&path).unwrap()
    };
    let a = decode_keys(&backend, &load(Preset::Smollm2, DType::Q8_0, 1));
    let b = decode_keys(&backend, &load(Preset::Smollm2, DType::Q8_0, 2));
    let other_type = decode_keys(&backend, &load(Preset::Smollm2, DType::Q4_0, 1));
    let other_arch = decode_keys(&backend, &load(Preset::Tinyllama, DType::Q8_0, 1));
    assert!(!a.is_empty());
    assert_eq!(a, b, "two versions of one shape");
    assert_ne!(a[0], other_type[0]);
    assert_ne!(a[0], other_arch[0]);
}

on_each_device!(checkpoints_of_one_shape_share_a_decode_key, threads = 1);
