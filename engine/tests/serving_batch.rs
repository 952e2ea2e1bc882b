//! The continuous-batching executor against the single-sequence `Session`:
//! batched greedy outputs must match token for token; cancelled sequences
//! must leave the batch; a full queue refuses work.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/real_models.rs"]
mod real_models;

#[path = "support/requests.rs"]
mod requests;

#[path = "support/served.rs"]
mod served;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use switchyard_engine::model::LogitRows;
use switchyard_engine::sampling::{argmax, FinishReason};
use switchyard_engine::serving::{
    CheckpointHandle, EventSink, Executor, ExecutorConfig, NoObserver, SequenceEvent,
    SequenceRequest, SubmitError,
};
use switchyard_engine::session::Session;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_engine::tokenizer::Tokenizer;
use switchyard_kernels::{on_each_device, Backend, DType};

struct Fixture<B: Backend> {
    backend: Arc<B>,
    checkpoint: CheckpointHandle<B>,
    tokenizer: Tokenizer,
    _dir: tempfile::TempDir,
}

fn fixture<B: Backend>(backend: Arc<B>) -> Fixture<B> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-q8.gguf");
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q8_0,
        seed: 11,
    };
    write_gguf(&spec, &path).unwrap();
    fixture_from(backend, &path, dir)
}

/// The fixture for the checkpoint at `path`.
fn fixture_from<B: Backend>(
    backend: Arc<B>,
    path: &std::path::Path,
    dir: tempfile::TempDir,
) -> Fixture<B> {
    let served = served::serve(&*backend, path);
    let tokenizer = served.tokenizer.clone();
    Fixture {
        backend,
        checkpoint: served,
        tokenizer,
        _dir: dir,
    }
}

fn greedy_with_session<B: Backend>(f: &Fixture<B>, prompt: &[u32], count: usize) -> Vec<u32> {
    greedy_with_logprobs(f, prompt, count).0
}

/// Greedy ids with a `Session`, and each chosen token's log-probability.
fn greedy_with_logprobs<B: Backend>(
    f: &Fixture<B>,
    prompt: &[u32],
    count: usize,
) -> (Vec<u32>, Vec<f32>) {
    let mut session = Session::new(
        f.backend.as_ref(),
        &f.checkpoint.model,
        prompt.len() + count,
    )
    .unwrap();
    let mut logits = session.feed(prompt, LogitRows::Last).unwrap();
    let (mut ids, mut logprobs) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let id = argmax(&logits);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_norm = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
        ids.push(id);
        logprobs.push(logits[id as usize] - log_norm);
        logits = session.decode(&[id], LogitRows::Last).unwrap();
    }
    (ids, logprobs)
}

/// An executor with the fixture's checkpoint as the target of `submit`.
struct Running<B: Backend> {
    exec: Executor<B>,
    checkpoint: CheckpointHandle<B>,
}

impl<B: Backend> Running<B> {
    fn submit(&self, request: SequenceRequest) -> Result<(), SubmitError> {
        self.exec.submit(&self.checkpoint, request)
    }

    fn shutdown(self) {
        self.exec.shutdown();
    }
}

impl<B: Backend> std::ops::Deref for Running<B> {
    type Target = Executor<B>;

    fn deref(&self) -> &Executor<B> {
        &self.exec
    }
}

fn executor<B: Backend>(f: &Fixture<B>, config: ExecutorConfig) -> Running<B> {
    Running {
        exec: Executor::spawn(f.backend.clone(), config, Arc::new(NoObserver)).unwrap(),
        checkpoint: f.checkpoint.clone(),
    }
}

/// Submits every prompt at once with a small step budget (chunked prefill
/// mixed with decode rows, more prompts than batch slots) and checks each
/// output against a lone `Session`: same ids, same log-probabilities.
fn check_batched_against_sessions<B: Backend>(f: &Fixture<B>, texts: &[&str], counts: &[usize]) {
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| f.tokenizer.encode(t, true).unwrap())
        .collect();
    let exec = executor(
        f,
        ExecutorConfig {
            max_active: 3,
            max_queued: 16,
            max_step_tokens: 6,
            ..ExecutorConfig::default()
        },
    );
    let receivers: Vec<_> = prompts
        .iter()
        .zip(counts)
        .map(|(prompt, &count)| {
            let (req, rx) = requests::on_channel(prompt.clone(), count);
            exec.submit(req).unwrap();
            rx
        })
        .collect();
    for ((prompt, &count), rx) in prompts.iter().zip(counts).zip(&receivers) {
        let requests::Finished {
            ids,
            logprobs,
            finish_reason: reason,
            prompt_tokens,
            completion_tokens,
            ..
        } = requests::finish(rx);
        let (expected_ids, expected_logprobs) = greedy_with_logprobs(f, prompt, count);
        assert_eq!(ids, expected_ids, "prompt {prompt:?}");
        for (got, want) in logprobs.iter().zip(&expected_logprobs) {
            assert!(
                (got - want).abs() < 1e-3,
                "logprob {got} vs {want} for {prompt:?}"
            );
        }
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(prompt_tokens, prompt.len());
        assert_eq!(completion_tokens, count);
    }
    exec.shutdown();
}

fn batched_greedy_matches_single_sequence_sessions<B: Backend>(backend: Arc<B>) {
    let f = fixture(backend);
    let texts = [
        "Hello there, how are you today?",
        "a",
        "The quick brown fox jumps over the lazy dog, again and again and again.",
        "1 2 3 4 5",
        "Once upon a time",
    ];
    check_batched_against_sessions(&f, &texts, &[12, 7, 16, 3, 10]);
}

on_each_device!(batched_greedy_matches_single_sequence_sessions);

fn batched_greedy_matches_sessions_on_the_real_model<B: Backend>(backend: Arc<B>) {
    let f = fixture_from(
        backend,
        &real_models::smollm2(),
        tempfile::tempdir().unwrap(),
    );
    let texts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea,",
        "1, 2, 3, 4,",
    ];
    check_batched_against_sessions(&f, &texts, &[10, 14, 8, 12]);
}

on_each_device!(batched_greedy_matches_sessions_on_the_real_model);

/// A sink that hands each event over only when the test takes it, so the
/// sequence cannot run ahead (or finish) while the test looks at it.
struct Rendezvous(mpsc::SyncSender<SequenceEvent>);

impl EventSink for Rendezvous {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.0.send(event).is_ok()
    }
}

fn wait_for_active<B: Backend>(exec: &Running<B>, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while exec.active_sequences() != count {
        assert!(
            Instant::now() < deadline,
            "{} sequences active, expected {count}",
            exec.active_sequences()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn a_dropped_receiver_cancels_its_sequence<B: Backend>(backend: Arc<B>) {
    let f = fixture(backend);
    let exec = executor(&f, ExecutorConfig::default());
    let prompt = f.tokenizer.encode("Tell me a long story", true).unwrap();
    let (events, rx) = mpsc::sync_channel(0);
    let (mut req, _unused) = requests::on_channel(prompt.clone(), 10_000);
    req.sink = Box::new(Rendezvous(events));
    exec.submit(req).unwrap();
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(60)).unwrap(),
        SequenceEvent::Token(_)
    ));
    // Blocked handing over its second token, the sequence is in the batch.
    wait_for_active(&exec, 1);
    assert!(exec.is_running());
    drop(rx);
    wait_for_active(&exec, 0);
    // The executor still serves after a cancellation.
    let (req, rx) = requests::on_channel(prompt.clone(), 4);
    exec.submit(req).unwrap();
    assert_eq!(requests::ids(&rx), greedy_with_session(&f, &prompt, 4));
    exec.shutdown();
}

on_each_device!(a_dropped_receiver_cancels_its_sequence);

fn a_full_queue_refuses_with_overloaded_and_bad_prompts_are_refused<B: Backend>(backend: Arc<B>) {
    let f = fixture(backend);
    let exec = executor(
        &f,
        ExecutorConfig {
            max_active: 1,
            max_queued: 1,
            max_step_tokens: 64,
            ..ExecutorConfig::default()
        },
    );
    let prompt = f.tokenizer.encode("Hello", true).unwrap();
    let (events, long_rx) = mpsc::sync_channel(0);
    let (mut long, _unused) = requests::on_channel(prompt.clone(), 10_000);
    long.sink = Box::new(Rendezvous(events));
    exec.submit(long).unwrap();
    // Once it streams, it holds the only batch slot and the queue is empty;
    // blocked handing over its next token, it cannot finish meanwhile.
    assert!(matches!(
        long_rx.recv_timeout(Duration::from_secs(60)).unwrap(),
        SequenceEvent::Token(_)
    ));
    let (waiting, waiting_rx) = requests::on_channel(prompt.clone(), 2);
    exec.submit(waiting).unwrap();
    assert_eq!(exec.queue_depth(), 1);
    let (refused, _refused_rx) = requests::on_channel(prompt.clone(), 2);
    assert_eq!(
        exec.submit(refused),
        Err(SubmitError::Overloaded { queued: 1 })
    );
    drop(long_rx);
    assert_eq!(requests::ids(&waiting_rx).len(), 2);

    let (empty, _rx) = requests::on_channel(Vec::new(), 2);
    assert_eq!(exec.submit(empty), Err(SubmitError::EmptyPrompt));
    exec.shutdown();
}

on_each_device!(a_full_queue_refuses_with_overloaded_and_bad_prompts_are_refused);

fn stop_tokens_and_stop_strings_end_with_stop_and_are_not_output<B: Backend>(backend: Arc<B>) {
    let f = fixture(backend);
    let exec = executor(&f, ExecutorConfig::default());
    let prompt = f.tokenizer.encode("Once upon a time", true).unwrap();
    let reference = greedy_with_session(&f, &prompt, 8);

    // The third greedy token as a stop token: generation ends at its first
    // occurrence, which is not reported but counted.
    let stop_id = reference[2];
    let first = reference.iter().position(|&id| id == stop_id).unwrap();
    let (mut req, rx) = requests::on_channel(prompt.clone(), 8);
    req.stop.stop_token_ids = vec![stop_id];
    exec.submit(req).unwrap();
    let finished = requests::finish(&rx);
    assert_eq!(finished.ids, reference[..first]);
    assert_eq!(finished.finish_reason, FinishReason::Stop);
    assert_eq!(finished.completion_tokens, first + 1);

    // Three characters of the greedy text as a stop string: the text before
    // its first occurrence comes out, and nothing of the stop string.
    let full = f.tokenizer.decode(&reference, true).unwrap();
    let head = f.tokenizer.decode(&reference[..2], true).unwrap();
    let stop: String = full[head.len()..].chars().take(3).collect();
    assert_eq!(
        stop.chars().count(),
        3,
        "the greedy text {full:?} is too short"
    );
    let expected = &full[..full.find(&stop).unwrap()];
    let (mut req, rx) = requests::on_channel(prompt.clone(), 8);
    req.decoder = Some(f.tokenizer.decode_stream(true));
    req.stop.stop_strings = vec![stop.clone()];
    exec.submit(req).unwrap();
    let finished = requests::finish(&rx);
    assert_eq!(finished.finish_reason, FinishReason::Stop);
    assert_eq!(finished.text, expected, "stop string {stop:?} in {full:?}");
    exec.shutdown();
}

on_each_device!(stop_tokens_and_stop_strings_end_with_stop_and_are_not_output);
