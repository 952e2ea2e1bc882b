//! Embeddings in the executor: several inputs (and a generation) share forward
//! steps, and each vector equals the one a lone `Session` computes for its input.
//! An embedding reads nothing from the prompt cache (its cached positions would
//! be missing from the mean).
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/requests.rs"]
mod requests;

#[path = "support/served.rs"]
mod served;

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use switchyard_engine::serving::{
    CheckpointHandle, CheckpointId, Executor, ExecutorConfig, ExecutorObserver, SequenceEvent,
    SequenceRequest, SequenceTask,
};
use switchyard_engine::session::Session;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::{on_each_device, Backend, DType};

/// Largest |batched - alone| per component. Every kernel computes a row on its
/// own, so the only difference is the chunking of a prompt across steps, which
/// changes no sum: the vectors agree to f32 rounding of the pooled sums.
const BATCHED_ATOL: f32 = 1e-5;

/// Sequences in each step, as the executor reports them.
#[derive(Default)]
struct Steps(Mutex<Vec<usize>>);

impl ExecutorObserver for Steps {
    fn step(&self, _: &CheckpointId, _rows: usize, sequences: usize, _: Duration) {
        self.0.lock().unwrap().push(sequences);
    }
}

fn checkpoint<B: Backend>(dir: &tempfile::TempDir, backend: &B) -> CheckpointHandle<B> {
    let path = dir.path().join("smollm2-q8.gguf");
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q8_0,
        seed: 5,
    };
    write_gguf(&spec, &path).unwrap();
    served::serve(backend, &path)
}

fn request(
    prompt: Vec<u32>,
    task: SequenceTask,
    max_tokens: usize,
) -> (SequenceRequest, mpsc::Receiver<SequenceEvent>) {
    let (mut request, receiver) = requests::on_channel(prompt, max_tokens);
    request.task = task;
    (request, receiver)
}

fn embedding(receiver: &mpsc::Receiver<SequenceEvent>) -> (Vec<f32>, usize) {
    match receiver.recv_timeout(requests::EVENT_WAIT).unwrap() {
        SequenceEvent::Embedding {
            vector,
            prompt_tokens,
        } => (vector, prompt_tokens),
        other => panic!("expected an embedding, got {other:?}"),
    }
}

fn alone<B: Backend>(backend: &B, checkpoint: &CheckpointHandle<B>, ids: &[u32]) -> Vec<f32> {
    let mut session = Session::new(backend, &checkpoint.model, ids.len()).unwrap();
    session.embed(ids).unwrap()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= BATCHED_ATOL, "{what}: max |diff| {worst}");
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1 + (seed * 31 + i * 7) % 250)
        .collect()
}

on_each_device!(embeddings_share_steps_and_equal_lone_sessions);
fn embeddings_share_steps_and_equal_lone_sessions<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = checkpoint(&dir, &*backend);
    let steps = Arc::new(Steps::default());
    let config = ExecutorConfig {
        // Small steps: each prompt takes several, so the requests overlap.
        max_step_tokens: 16,
        ..ExecutorConfig::default()
    };
    let exec = Executor::spawn(backend.clone(), config, steps.clone()).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(i, 40 + 9 * i as usize)).collect();
    let mut receivers = Vec::new();
    for ids in &prompts {
        let (request, receiver) = request(ids.clone(), SequenceTask::Embed, 0);
        exec.submit(&checkpoint, request).unwrap();
        receivers.push(receiver);
    }
    // A generation runs beside them.
    let (generation, generated) = request(prompt(9, 12), SequenceTask::Generate, 4);
    exec.submit(&checkpoint, generation).unwrap();

    let hidden = checkpoint.model.config().hidden_size;
    for (ids, receiver) in prompts.iter().zip(&receivers) {
        let (vector, prompt_tokens) = embedding(receiver);
        assert_eq!(prompt_tokens, ids.len());
        assert_eq!(vector.len(), hidden);
        let norm: f32 = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
        assert_close(&vector, &alone(&*backend, &checkpoint, ids), "batched");
    }
    assert_eq!(requests::ids(&generated).len(), 4);
    let most = steps.0.lock().unwrap().iter().copied().max().unwrap_or(0);
    assert!(
        most >= 2,
        "no step ran two sequences at once: the embeddings were not batched"
    );
}

on_each_device!(an_embedding_reads_no_cached_prompt_blocks);
fn an_embedding_reads_no_cached_prompt_blocks<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = checkpoint(&dir, &*backend);
    let exec = Executor::spawn(
        backend.clone(),
        ExecutorConfig::default(),
        Arc::new(switchyard_engine::serving::NoObserver),
    )
    .unwrap();
    let ids = prompt(3, 80);
    // A generation leaves the prompt's blocks in the prompt cache.
    let (generation, generated) = request(ids.clone(), SequenceTask::Generate, 1);
    exec.submit(&checkpoint, generation).unwrap();
    requests::finish(&generated);
    let (embed, receiver) = request(ids.clone(), SequenceTask::Embed, 0);
    exec.submit(&checkpoint, embed).unwrap();
    let (vector, _) = embedding(&receiver);
    assert_close(
        &vector,
        &alone(&*backend, &checkpoint, &ids),
        "after a cached prompt",
    );
}

on_each_device!(an_embedding_may_fill_the_whole_context);
fn an_embedding_may_fill_the_whole_context<B: Backend>(backend: Arc<B>) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = checkpoint(&dir, &*backend);
    let exec = Executor::spawn(
        backend.clone(),
        ExecutorConfig::default(),
        Arc::new(switchyard_engine::serving::NoObserver),
    )
    .unwrap();
    let context = checkpoint.model.config().context_length;
    let (embed, receiver) = request(prompt(1, context), SequenceTask::Embed, 0);
    exec.submit(&checkpoint, embed).unwrap();
    assert_eq!(embedding(&receiver).1, context);
    let (too_long, _) = request(prompt(1, context + 1), SequenceTask::Embed, 0);
    assert!(exec.submit(&checkpoint, too_long).is_err());
}
