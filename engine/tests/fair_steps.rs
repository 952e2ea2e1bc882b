//! Fair admission under contention (issue 37): while one tenant keeps 48
//! sequences decoding, another tenant's new request runs its prompt in the
//! very next step, and the steps among those decode rows stay short
//! (`engine/src/serving/step_room.rs`), so the step a newcomer waits for is
//! short; so do the steps while that tenant's streams all start at once.
//! Ordering, not timing: the steps are counted and sized by the executor's
//! observer.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/served.rs"]
mod served;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use switchyard_engine::kv::KvConfig;
use switchyard_engine::sampling::{FinishReason, SamplingParams, StopCondition};
use switchyard_engine::serving::{
    CheckpointId, EventSink, Executor, ExecutorConfig, ExecutorObserver, SequenceEvent,
    SequenceRequest,
};
use switchyard_engine::speculate::Speculation;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::{on_each_device, Backend, DType, KvType};
use switchyard_seam::{CacheScope, TenantShare};

/// The heavy tenant's decoding sequences.
const HEAVY: usize = 48;
/// The executor's step budget (the default).
const MAX_STEP_TOKENS: usize = 256;

/// Counts the steps and keeps each one's rows and sequences.
#[derive(Default)]
struct Steps {
    count: AtomicU64,
    sizes: Mutex<Vec<(usize, usize)>>,
    /// Armed by a test: the next report of the queue's depth (made after an
    /// admission, just before the step) says so on the first channel and
    /// waits for a word on the second, holding the executor there.
    gate: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl ExecutorObserver for Steps {
    fn step(&self, _: &CheckpointId, rows: usize, sequences: usize, _: Duration) {
        // One checkpoint: one call per step, made before the step's tokens go out.
        self.count.fetch_add(1, Ordering::AcqRel);
        self.sizes.lock().unwrap().push((rows, sequences));
    }

    fn queue_depth(&self, _: &CheckpointId, _: usize) {
        let gate = self.gate.lock().unwrap().take();
        if let Some((entered, release)) = gate {
            entered.send(()).unwrap();
            release.recv().unwrap();
        }
    }
}

/// Hands each event over only when the test takes it, so that the test can
/// hold the executor between two steps.
struct Held(mpsc::SyncSender<SequenceEvent>);

impl EventSink for Held {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.0.send(event).is_ok()
    }
}

/// Notes the step count when its first token goes out.
struct FirstStep {
    steps: Arc<Steps>,
    first: Arc<AtomicU64>,
    sender: mpsc::Sender<SequenceEvent>,
}

impl EventSink for FirstStep {
    fn send(&mut self, event: SequenceEvent) -> bool {
        if matches!(event, SequenceEvent::Token(_)) {
            let now = self.steps.count.load(Ordering::Acquire);
            let _ = self
                .first
                .compare_exchange(u64::MAX, now, Ordering::AcqRel, Ordering::Acquire);
        }
        self.sender.send(event).is_ok()
    }
}

fn request(
    tenant: &str,
    prompt_len: usize,
    max_tokens: usize,
    sink: Box<dyn EventSink>,
) -> SequenceRequest {
    SequenceRequest {
        prompt: (1..=prompt_len as u32).collect(),
        sampling: SamplingParams::default(),
        stop: StopCondition {
            max_tokens: Some(max_tokens),
            ..StopCondition::default()
        },
        decoder: None,
        sink,
        deadline: None,
        constraint: None,
        cache_scope: CacheScope::default(),
        share: TenantShare::new(tenant, 1),
        task: Default::default(),
    }
}

/// Events until `Done`, with its finish reason; panics on an error.
fn finish(rx: &mpsc::Receiver<SequenceEvent>) -> FinishReason {
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            SequenceEvent::Token(_) => {}
            SequenceEvent::Done { finish_reason, .. } => return finish_reason,
            SequenceEvent::Error(e) => panic!("the sequence failed: {e}"),
            SequenceEvent::Embedding { .. } => panic!("a generation reported an embedding"),
        }
    }
}

/// The first event of `rx`, which must be a token.
fn first_token(rx: &mpsc::Receiver<SequenceEvent>) {
    let event = rx.recv_timeout(Duration::from_secs(120)).unwrap();
    assert!(matches!(event, SequenceEvent::Token(_)), "{event:?}");
}

/// An executor over a small synthetic checkpoint, with its step observer.
fn executor<B: Backend>(
    backend: &Arc<B>,
) -> (
    Executor<B>,
    switchyard_engine::serving::CheckpointHandle<B>,
    Arc<Steps>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-q8.gguf");
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q8_0,
        seed: 11,
    };
    write_gguf(&spec, &path).unwrap();
    let checkpoint = served::serve(&**backend, &path);
    let steps = Arc::new(Steps::default());
    let observer: Arc<dyn ExecutorObserver> = steps.clone();
    let config = ExecutorConfig {
        max_active: 64,
        max_queued: 64,
        max_step_tokens: MAX_STEP_TOKENS,
        // Every prompt token is computed: rows count what was asked.
        prompt_cache: false,
        kv: KvConfig {
            dtype: KvType::F16,
            budget_bytes: 64 << 20,
            block_positions: 32,
        },
        speculation: Speculation::Off,
    };
    let exec = Executor::spawn(backend.clone(), config, observer).unwrap();
    (exec, checkpoint, steps, dir)
}

/// The light tenant's request of a 40-token prompt, submitted now: waits for
/// its end and returns the step of its first token and the step count at submit.
fn light_request<B: Backend>(
    exec: &Executor<B>,
    checkpoint: &switchyard_engine::serving::CheckpointHandle<B>,
    steps: &Arc<Steps>,
) -> (mpsc::Receiver<SequenceEvent>, Arc<AtomicU64>, u64) {
    let first = Arc::new(AtomicU64::new(u64::MAX));
    let (light_tx, light_rx) = mpsc::channel();
    let sink = FirstStep {
        steps: Arc::clone(steps),
        first: Arc::clone(&first),
        sender: light_tx,
    };
    exec.submit(checkpoint, request("light", 40, 4, Box::new(sink)))
        .unwrap();
    let submitted = steps.count.load(Ordering::Acquire);
    (light_rx, first, submitted)
}

fn a_light_tenants_prompt_runs_next_and_busy_steps_stay_short<B: Backend>(backend: Arc<B>) {
    let (exec, checkpoint, steps, _dir) = executor(&backend);

    // The heavy tenant's 48 streams; the first hands over its tokens one at
    // a time, so the test decides when the executor goes on.
    let (held_tx, held_rx) = mpsc::sync_channel(0);
    exec.submit(
        &checkpoint,
        request("heavy", 4, 80, Box::new(Held(held_tx))),
    )
    .unwrap();
    let mut heavy_rx = Vec::new();
    for _ in 1..HEAVY {
        let (tx, rx) = mpsc::channel();
        exec.submit(&checkpoint, request("heavy", 4, 80, Box::new(tx)))
            .unwrap();
        heavy_rx.push(rx);
    }
    // A few short steps (48 sequences make them busy): every heavy stream
    // runs its prompt and decodes; the held one goes on a step at a time.
    first_token(&held_rx);
    for rx in &heavy_rx {
        loop {
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok(event) => {
                    assert!(matches!(event, SequenceEvent::Token(_)), "{event:?}");
                    break;
                }
                Err(_) => first_token(&held_rx),
            }
        }
    }
    // Two long prompts of the heavy tenant come among its decode rows: the
    // steps from here on run all 48 streams' decode rows.
    let from = steps.sizes.lock().unwrap().len();
    let long_rx: Vec<_> = (0..2)
        .map(|_| {
            let (tx, rx) = mpsc::channel();
            exec.submit(&checkpoint, request("heavy", 120, 8, Box::new(tx)))
                .unwrap();
            rx
        })
        .collect();
    for _ in 0..2 {
        first_token(&held_rx);
    }
    // The executor is held in (or just before) handing over the held
    // stream's token: the light tenant's request comes now.
    let (light_rx, first, submitted) = light_request(&exec, &checkpoint, &steps);
    let held = std::thread::spawn(move || finish(&held_rx));

    assert_eq!(finish(&light_rx), FinishReason::Length);
    let first = first.load(Ordering::Acquire);
    // The step running when it came (at most), then its own.
    assert!(
        first <= submitted + 2,
        "the light tenant's first token came in step {first}, {} steps after it was \
         submitted beside {HEAVY} decoding sequences",
        first - submitted
    );
    assert_eq!(held.join().unwrap(), FinishReason::Length);
    for rx in heavy_rx.iter().chain(&long_rx) {
        assert_eq!(finish(rx), FinishReason::Length);
    }
    exec.shutdown();

    // Among the heavy tenant's decode rows, a step ran at most a quarter of
    // the budget beyond them: before, the long prompts filled the rest of the
    // budget (48 decode rows and 208 prompt tokens), and a newcomer waited
    // for such a step to end.
    let sizes = steps.sizes.lock().unwrap();
    let busy: Vec<(usize, usize)> = (sizes.get(from..).unwrap_or_default().iter())
        .copied()
        .filter(|&(_, sequences)| sequences >= HEAVY)
        .collect();
    assert!(
        busy.iter().any(|&(rows, sequences)| rows > sequences),
        "no step ran a prompt chunk beside the decode rows: {busy:?}"
    );
    let cap = MAX_STEP_TOKENS / 4;
    for &(rows, sequences) in &busy {
        assert!(
            rows <= sequences + cap,
            "a step of {rows} rows ran beside {sequences} sequences (at most {cap} more \
             expected): {busy:?}"
        );
    }
}
on_each_device!(a_light_tenants_prompt_runs_next_and_busy_steps_stay_short);

/// The heavy tenant's 48 streams start together: their prompts all wait and
/// almost nothing decodes. Before, such steps filled the whole budget with
/// prompt chunks (256 rows among a handful of sequences), four times a busy
/// step, and a newcomer that came during one waited for all of it; now the
/// sequences make the step busy, so it runs at most a quarter of the budget.
fn a_wave_of_prompts_runs_in_short_steps<B: Backend>(backend: Arc<B>) {
    let (exec, checkpoint, steps, _dir) = executor(&backend);
    // The first stream hands over its tokens one at a time (the test decides
    // when the executor goes on); the others' prompts come while it is held.
    let (held_tx, held_rx) = mpsc::sync_channel(0);
    exec.submit(
        &checkpoint,
        request("heavy", 4, 80, Box::new(Held(held_tx))),
    )
    .unwrap();
    let heavy_rx: Vec<_> = (1..HEAVY)
        .map(|_| {
            let (tx, rx) = mpsc::channel();
            // Long enough that 16 or more run until every prompt has run.
            exec.submit(&checkpoint, request("heavy", 40, 24, Box::new(tx)))
                .unwrap();
            rx
        })
        .collect();
    first_token(&held_rx);
    // From here on the 47 prompts (1,880 tokens) run beside one decode row.
    let from = steps.sizes.lock().unwrap().len();
    for _ in 0..2 {
        first_token(&held_rx);
    }
    let (light_rx, first, submitted) = light_request(&exec, &checkpoint, &steps);
    let held = std::thread::spawn(move || finish(&held_rx));
    assert_eq!(finish(&light_rx), FinishReason::Length);
    let first = first.load(Ordering::Acquire);
    assert!(
        first <= submitted + 2,
        "the light tenant's first token came {} steps after it was submitted among \
         {HEAVY} sequences starting",
        first - submitted
    );
    assert_eq!(held.join().unwrap(), FinishReason::Length);
    for rx in &heavy_rx {
        assert_eq!(finish(rx), FinishReason::Length);
    }
    exec.shutdown();

    let sizes = steps.sizes.lock().unwrap();
    let wave: Vec<(usize, usize)> = sizes.get(from..).unwrap_or_default().to_vec();
    assert!(
        wave.iter().any(|&(rows, sequences)| rows > sequences),
        "no prompt chunk ran in the steps observed: {wave:?}"
    );
    let cap = MAX_STEP_TOKENS / 4;
    let least = MAX_STEP_TOKENS / 16;
    for &(rows, sequences) in &wave {
        assert!(
            rows <= cap.max(sequences + least),
            "a step of {rows} rows ran among {HEAVY} sequences starting (at most {cap} \
             expected): {wave:?}"
        );
    }
}
on_each_device!(a_wave_of_prompts_runs_in_short_steps);

/// The token ids of `rx`'s sequence, to its end.
fn token_ids(rx: &mpsc::Receiver<SequenceEvent>) -> Vec<u32> {
    let mut ids = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            SequenceEvent::Token(token) => ids.push(token.id),
            SequenceEvent::Done { .. } => return ids,
            SequenceEvent::Error(e) => panic!("the sequence failed: {e}"),
            SequenceEvent::Embedding { .. } => panic!("a generation reported an embedding"),
        }
    }
}

/// A request that comes while the heavy tenant's step runs no longer waits
/// for that step: the step pauses between two layers, the newcomer's prompt
/// runs in a step of its own and its first token goes out, then the paused
/// step ends (`engine/src/serving/interleave.rs`). Before, its first token
/// came in the step after the one in flight. Every output is the one it
/// gives alone (greedy). The executor is held just before a step (while it
/// reports the queue's depth after admitting the heavy tenant's last
/// stream) and the light request is submitted then, so it comes during that
/// step, whose first layer has not begun.
fn a_newcomer_runs_between_two_layers_of_the_step_in_flight<B: Backend>(backend: Arc<B>) {
    let (exec, checkpoint, steps, _dir) = executor(&backend);
    let heavy_tokens = 24;
    let heavy_rx: Vec<_> = (1..HEAVY)
        .map(|_| {
            let (tx, rx) = mpsc::channel();
            exec.submit(&checkpoint, request("heavy", 4, heavy_tokens, Box::new(tx)))
                .unwrap();
            rx
        })
        .collect();
    let mut heavy_ids: Vec<Vec<u32>> = Vec::new();
    for rx in &heavy_rx {
        let event = rx.recv_timeout(Duration::from_secs(120)).unwrap();
        let SequenceEvent::Token(token) = event else {
            panic!("{event:?}");
        };
        heavy_ids.push(vec![token.id]);
    }
    // Every heavy stream decodes. Hold the executor after it admits the last
    // one, before the step that runs it beside the others.
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *steps.gate.lock().unwrap() = Some((entered_tx, release_rx));
    let (last_tx, last_rx) = mpsc::channel();
    exec.submit(
        &checkpoint,
        request("heavy", 4, heavy_tokens, Box::new(last_tx)),
    )
    .unwrap();
    entered_rx.recv_timeout(Duration::from_secs(120)).unwrap();
    let before = steps.count.load(Ordering::Acquire);
    let first = Arc::new(AtomicU64::new(u64::MAX));
    let (light_tx, light_rx) = mpsc::channel();
    let sink = FirstStep {
        steps: Arc::clone(&steps),
        first: Arc::clone(&first),
        sender: light_tx,
    };
    exec.submit(&checkpoint, request("light", 40, 4, Box::new(sink)))
        .unwrap();
    release_tx.send(()).unwrap();

    let light_ids = token_ids(&light_rx);
    let first = first.load(Ordering::Acquire);
    for (ids, rx) in heavy_ids.iter_mut().zip(&heavy_rx) {
        ids.extend(token_ids(rx));
    }
    heavy_ids.push(token_ids(&last_rx));
    {
        let sizes = steps.sizes.lock().unwrap();
        let at = usize::try_from(before).unwrap();
        let after: Vec<(usize, usize)> = sizes.get(at..at + 2).unwrap_or_default().to_vec();
        // The light prompt's own step, then the paused one of 48 sequences.
        assert_eq!(
            first,
            before + 1,
            "the light tenant's first token came {} steps after the step in flight began \
             (steps from then: {after:?})",
            first - before
        );
        assert_eq!(after.first(), Some(&(40, 1)), "{after:?}");
        assert_eq!(after.get(1).map(|s| s.1), Some(HEAVY), "{after:?}");
    }

    // Alone, each request gives the same tokens.
    let (tx, rx) = mpsc::channel();
    exec.submit(&checkpoint, request("light", 40, 4, Box::new(tx)))
        .unwrap();
    assert_eq!(token_ids(&rx), light_ids);
    let (tx, rx) = mpsc::channel();
    exec.submit(&checkpoint, request("heavy", 4, heavy_tokens, Box::new(tx)))
        .unwrap();
    let alone = token_ids(&rx);
    assert_eq!(alone.len(), heavy_tokens);
    for ids in &heavy_ids {
        assert_eq!(ids, &alone);
    }
    exec.shutdown();
}
on_each_device!(
    a_newcomer_runs_between_two_layers_of_the_step_in_flight,
    cpu_only = "a device backend records and replays whole steps: it does not pause one"
);
