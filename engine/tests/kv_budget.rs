//! Admission by KV blocks (issue 17, item 3): a request whose cache can
//! never fit the backend's KV budget is refused at submit with what to
//! change, one that fits the budget but not what is free waits while the
//! running sequences go on, and every reservation comes back.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/requests.rs"]
mod requests;

#[path = "support/served.rs"]
mod served;

use std::sync::{mpsc, Arc};
use std::time::Duration;

use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::KvConfig;
use switchyard_engine::model::LlamaModel;
use switchyard_engine::sampling::FinishReason;
use switchyard_engine::serving::{
    CheckpointHandle, Executor, ExecutorConfig, KvAdvice, NoObserver, SequenceEvent,
    SequenceRequest, SubmitError,
};
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::DType;
use switchyard_kernels::KvType;
use switchyard_kernels::{on_each_device, Backend};

/// Positions per KV block: the smallest the backend takes, so that the
/// preset's 256-position context spans eight.
const BLOCK: usize = 32;
/// The budget in blocks of every layer: 128 positions.
const BUDGET_BLOCKS: usize = 4;

struct Fixture<B: Backend> {
    backend: Arc<B>,
    /// The executor's KV settings.
    kv: KvConfig,
    checkpoint: CheckpointHandle<B>,
    _dir: tempfile::TempDir,
}

/// A synthetic SmolLM2 (context 256) on a backend whose F16 KV budget holds
/// [`BUDGET_BLOCKS`] blocks of every layer.
fn fixture<B: Backend>(backend: &Arc<B>) -> Fixture<B> {
    fixture_of(backend, KvType::F16).0
}

/// As [`fixture`] for a KV type, with the bytes of one block of every
/// layer: 2 bytes an element for F16, 34 bytes per 32 for Q8_0.
fn fixture_of<B: Backend>(backend: &Arc<B>, dtype: KvType) -> (Fixture<B>, usize) {
    let backend = Arc::clone(backend);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-q8.gguf");
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q8_0,
        seed: 11,
    };
    write_gguf(&spec, &path).unwrap();
    let checkpoint = load_checkpoint(&path).unwrap();
    let model = LlamaModel::load(&*backend, &checkpoint).unwrap();
    let c = model.config();
    assert_eq!(
        c.context_length, 256,
        "the test assumes the preset's context"
    );
    let elements = c.n_layers * c.n_kv_heads * c.head_dim * 2 * BLOCK;
    let block_bytes = match dtype {
        KvType::F32 => elements * 4,
        KvType::F16 => elements * 2,
        KvType::Q8_0 => elements / 32 * 34,
    };
    let kv = KvConfig {
        dtype,
        budget_bytes: BUDGET_BLOCKS * block_bytes,
        block_positions: BLOCK,
    };
    let checkpoint = served::serve(&*backend, &path);
    let fixture = Fixture {
        backend,
        kv,
        checkpoint,
        _dir: dir,
    };
    (fixture, block_bytes)
}

/// A request for `prompt_len` tokens and `max_tokens`, its events handed
/// over one at a time so a test can hold a sequence in the batch.
fn request(
    prompt_len: usize,
    max_tokens: Option<usize>,
) -> (SequenceRequest, mpsc::Receiver<SequenceEvent>) {
    requests::on_one_slot((1..=prompt_len as u32).collect(), max_tokens)
}

fn executor<B: Backend>(f: &Fixture<B>) -> Executor<B> {
    let config = ExecutorConfig {
        max_active: 8,
        max_queued: 8,
        max_step_tokens: 64,
        kv: f.kv,
        ..ExecutorConfig::default()
    };
    Executor::spawn(f.backend.clone(), config, Arc::new(NoObserver)).unwrap()
}

fn submit<B: Backend>(exec: &Executor<B>, f: &Fixture<B>, request: SequenceRequest) {
    exec.submit(&f.checkpoint, request).unwrap();
}

/// Tokens until `Done`, with its finish reason; panics on an error.
fn finish(rx: &mpsc::Receiver<SequenceEvent>) -> (usize, FinishReason) {
    let finished = requests::finish(rx);
    (finished.ids.len(), finished.finish_reason)
}

/// Where one sequence's events fell in the executor's order.
struct Timeline {
    /// Tokens received.
    tokens: usize,
    /// The index of its first token among every event received.
    started: usize,
    /// The index of its `Done`.
    done: usize,
}

/// Reads every sequence to its end. Each sink hands over one event at a
/// time, so the executor waits on whichever one this has not yet taken:
/// the order events arrive in is the executor's, not the order in which
/// reader threads happened to wake.
fn in_executor_order<const N: usize>(
    receivers: [mpsc::Receiver<SequenceEvent>; N],
) -> [Timeline; N] {
    let mut lines: [Option<Timeline>; N] = std::array::from_fn(|_| None);
    let mut tokens = [0; N];
    let mut started = [usize::MAX; N];
    let mut received = 0;
    let deadline = std::time::Instant::now() + requests::EVENT_WAIT;
    while lines.iter().any(Option::is_none) {
        assert!(
            std::time::Instant::now() < deadline,
            "a sequence fell silent"
        );
        let mut idle = true;
        for (i, receiver) in receivers.iter().enumerate() {
            if lines[i].is_some() {
                continue;
            }
            let event = match receiver.try_recv() {
                Ok(event) => event,
                Err(mpsc::TryRecvError::Empty) => continue,
                Err(mpsc::TryRecvError::Disconnected) => panic!("sequence {i}'s sink closed"),
            };
            idle = false;
            match event {
                SequenceEvent::Token(_) => {
                    tokens[i] += 1;
                    started[i] = started[i].min(received);
                }
                SequenceEvent::Done { .. } => {
                    lines[i] = Some(Timeline {
                        tokens: tokens[i],
                        started: started[i],
                        done: received,
                    })
                }
                other => panic!("sequence {i} failed: {other:?}"),
            }
            received += 1;
        }
        if idle {
            std::thread::yield_now();
        }
    }
    lines.map(|line| line.expect("the loop ends when every line is done"))
}

fn a_cache_that_can_never_fit_is_refused_with_what_to_change<B: Backend>(backend: Arc<B>) {
    let f = fixture(&backend);
    let exec = executor(&f);
    let pool = Arc::clone(exec.kv_pool());
    let refusal = |prompt_len, max_tokens| {
        let (req, _rx) = request(prompt_len, max_tokens);
        exec.submit(&f.checkpoint, req)
    };
    // No max_tokens: the cache spans the whole context (8 blocks).
    match refusal(5, None) {
        Err(SubmitError::KvBudget {
            positions: 256,
            advice: KvAdvice::SetMaxTokens,
            prompt_too_long: false,
            needed_bytes,
            budget_bytes,
        }) => assert!(needed_bytes > budget_bytes),
        other => panic!("expected a KV budget refusal, got {other:?}"),
    }
    match refusal(5, Some(200)) {
        Err(SubmitError::KvBudget {
            positions: 205,
            advice: KvAdvice::LowerMaxTokens,
            ..
        }) => {}
        other => panic!("expected a KV budget refusal, got {other:?}"),
    }
    // 200 prompt tokens (7 blocks) cannot fit whatever max_tokens says.
    match refusal(200, Some(1)) {
        Err(SubmitError::KvBudget {
            advice: KvAdvice::ShortenPrompt,
            prompt_too_long: true,
            ..
        }) => {}
        other => panic!("expected a KV budget refusal, got {other:?}"),
    }
    // Nothing was reserved by the refusals, and a request that fits runs.
    assert_eq!(pool.reserved_bytes(), 0);
    let (req, rx) = request(5, Some(BUDGET_BLOCKS * BLOCK - 5));
    submit(&exec, &f, req);
    assert_eq!(
        finish(&rx),
        (BUDGET_BLOCKS * BLOCK - 5, FinishReason::Length)
    );
    exec.shutdown();
    assert_eq!(pool.reserved_bytes(), 0);
}
on_each_device!(a_cache_that_can_never_fit_is_refused_with_what_to_change);

fn a_cache_that_fits_later_waits_while_the_running_sequence_goes_on<B: Backend>(backend: Arc<B>) {
    let f = fixture(&backend);
    let exec = executor(&f);
    let pool = Arc::clone(exec.kv_pool());
    // Each needs 3 of the 4 blocks: the second waits for the first.
    let (first, first_rx) = request(5, Some(80));
    let (second, second_rx) = request(5, Some(80));
    submit(&exec, &f, first);
    assert!(matches!(
        first_rx.recv_timeout(Duration::from_secs(60)).unwrap(),
        SequenceEvent::Token(_)
    ));
    submit(&exec, &f, second);
    // The first keeps streaming while the second waits in the queue.
    for _ in 0..10 {
        assert!(matches!(
            first_rx.recv_timeout(Duration::from_secs(60)).unwrap(),
            SequenceEvent::Token(_)
        ));
    }
    assert_eq!(exec.active_sequences(), 1);
    assert_eq!(exec.queue_depth(), 1);
    assert!(second_rx.try_recv().is_err());
    // When the first ends its blocks come back and the second runs.
    let (rest, reason) = finish(&first_rx);
    assert_eq!((rest + 11, reason), (80, FinishReason::Length));
    assert_eq!(finish(&second_rx), (80, FinishReason::Length));
    exec.shutdown();
    assert_eq!(pool.reserved_bytes(), 0);
}
on_each_device!(a_cache_that_fits_later_waits_while_the_running_sequence_goes_on);

fn a_q8_0_budget_admits_exactly_its_blocks<B: Backend>(backend: Arc<B>) {
    let (f, block_bytes) = fixture_of(&backend, KvType::Q8_0);
    let exec = executor(&f);
    let pool = Arc::clone(exec.kv_pool());
    // One position past the budget's blocks needs a fifth block: refused,
    // asking for exactly five blocks' bytes.
    let (req, _rx) = request(5, Some(BUDGET_BLOCKS * BLOCK - 4));
    match exec.submit(&f.checkpoint, req) {
        Err(SubmitError::KvBudget {
            needed_bytes,
            budget_bytes,
            ..
        }) => assert_eq!(
            (needed_bytes, budget_bytes),
            (
                (BUDGET_BLOCKS + 1) * block_bytes,
                BUDGET_BLOCKS * block_bytes
            )
        ),
        other => panic!("expected a KV budget refusal, got {other:?}"),
    }
    // The budget's blocks exactly: runs to the end.
    let (req, rx) = request(5, Some(BUDGET_BLOCKS * BLOCK - 5));
    submit(&exec, &f, req);
    assert_eq!(
        finish(&rx),
        (BUDGET_BLOCKS * BLOCK - 5, FinishReason::Length)
    );
    exec.shutdown();
    assert_eq!(pool.reserved_bytes(), 0);
}
on_each_device!(
    a_q8_0_budget_admits_exactly_its_blocks,
    cpu_only = "Q8_0 KV"
);

/// Issue 32, case 4: a request waiting for room at the head of the line no
/// longer holds everyone behind it: a younger one that fits what is free
/// runs past it (a bounded number of times), and the head runs when room comes.
fn a_small_request_passes_a_head_that_waits_for_room<B: Backend>(backend: Arc<B>) {
    let f = fixture(&backend);
    let exec = executor(&f);
    // 3 of the 4 blocks run; the head waits for 3; the small one needs the 1 free.
    let (first, first_rx) = request(5, Some(80));
    let (head, head_rx) = request(5, Some(80));
    let (small, small_rx) = request(5, Some(20));
    submit(&exec, &f, first);
    assert!(matches!(
        first_rx.recv_timeout(Duration::from_secs(60)).unwrap(),
        SequenceEvent::Token(_)
    ));
    submit(&exec, &f, head);
    submit(&exec, &f, small);
    let [first, head, small] = in_executor_order([first_rx, head_rx, small_rx]);
    assert_eq!((first.tokens, head.tokens, small.tokens), (79, 80, 20));
    assert!(
        small.done < first.done,
        "the small request waited for the first to end"
    );
    assert!(
        head.started > first.done,
        "the head ran before there was room"
    );
    let pool = Arc::clone(exec.kv_pool());
    exec.shutdown();
    assert_eq!(pool.reserved_bytes(), 0);
}
on_each_device!(a_small_request_passes_a_head_that_waits_for_room);

/// Issue 32, case 4: one request's generations together may reserve at most
/// half of the KV budget (`n: 16` of long generations held 95% of it).
fn a_request_fanning_out_past_its_share_of_the_budget_is_refused<B: Backend>(backend: Arc<B>) {
    let f = fixture(&backend);
    let exec = executor(&f);
    let (large, _rx) = request(5, Some(80));
    // One generation of 3 blocks is fine; two (6 of 4 blocks, share 2) are not.
    assert_eq!(exec.check_share(&f.checkpoint, &large, 1), Ok(()));
    match exec.check_share(&f.checkpoint, &large, 2) {
        Err(error @ SubmitError::KvShare { fanout: 2, .. }) => {
            assert!(error.to_string().contains("lower n"), "{error}");
        }
        other => panic!("expected a share refusal, got {other:?}"),
    }
    let (small, _rx) = request(5, Some(20));
    assert_eq!(exec.check_share(&f.checkpoint, &small, 2), Ok(()));
    assert_eq!(exec.kv_pool().reserved_bytes(), 0);
    exec.shutdown();
}
on_each_device!(a_request_fanning_out_past_its_share_of_the_budget_is_refused);

/// A request of `tenant` allowed `permille` thousandths of the budget and queue.
fn tenant_request(
    tenant: &str,
    permille: u16,
    max_tokens: usize,
) -> (SequenceRequest, mpsc::Receiver<SequenceEvent>) {
    let (mut request, receiver) = request(5, Some(max_tokens));
    request.share = switchyard_seam::TenantShare::new(tenant, 1).with_kv_permille(permille);
    (request, receiver)
}

/// Issue 32: one tenant's requests together reserve at most its part of the
/// KV budget (`kv_share`). Half each: a tenant flooding two-block requests
/// runs one at a time, and the other tenant's request runs beside it at
/// once, although the flood came first (before, the flood's second request
/// took the free half and the other tenant waited for the first to end).
fn one_tenant_flooding_leaves_the_other_its_part_of_the_budget<B: Backend>(backend: Arc<B>) {
    let f = fixture(&backend);
    let exec = executor(&f);
    // 5 + 50 positions: two of the four blocks, one tenant's half.
    let (heavy_first, heavy_first_rx) = tenant_request("heavy", 500, 50);
    submit(&exec, &f, heavy_first);
    assert!(matches!(
        heavy_first_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap(),
        SequenceEvent::Token(_)
    ));
    let (heavy_second, heavy_second_rx) = tenant_request("heavy", 500, 50);
    let (heavy_third, heavy_third_rx) = tenant_request("heavy", 500, 50);
    let (light, light_rx) = tenant_request("light", 500, 50);
    submit(&exec, &f, heavy_second);
    submit(&exec, &f, heavy_third);
    submit(&exec, &f, light);
    let [first, second, third, light] =
        in_executor_order([heavy_first_rx, heavy_second_rx, heavy_third_rx, light_rx]);
    assert_eq!((first.tokens, light.tokens), (49, 50));
    assert!(
        light.started < first.done,
        "the light tenant waited for the heavy one's sequence to end"
    );
    // The heavy tenant's own requests ran one after another.
    assert!(second.started > first.done && third.started > second.done);
    let pool = Arc::clone(exec.kv_pool());
    exec.shutdown();
    assert_eq!(pool.reserved_bytes(), 0);
}
on_each_device!(one_tenant_flooding_leaves_the_other_its_part_of_the_budget);

/// Issue 32: a tenant's requests fill at most its part of the waiting queue,
/// then get `TenantQueueFull` (429 over HTTP) while another tenant still
/// queues; one whose caches alone exceed its tenant's part is refused.
fn a_tenant_past_its_part_of_the_queue_is_refused_and_others_still_queue<B: Backend>(
    backend: Arc<B>,
) {
    let f = fixture(&backend);
    let exec = executor(&f);
    // A quarter of 8 queue places and of 4 blocks: 2 places, 1 block.
    let (running, running_rx) = tenant_request("heavy", 250, 20);
    submit(&exec, &f, running);
    // The executor now waits for this token to be taken: nothing is admitted.
    let _held = running_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let (req, rx) = tenant_request("heavy", 250, 20);
        submit(&exec, &f, req);
        waiting.push(rx);
    }
    let (refused, _rx) = tenant_request("heavy", 250, 20);
    match exec.submit(&f.checkpoint, refused) {
        Err(error @ SubmitError::TenantQueueFull { waiting: 2 }) => {
            assert!(error.to_string().contains("retry"), "{error}");
        }
        other => panic!("expected the tenant's queue to be full, got {other:?}"),
    }
    let (light, light_rx) = tenant_request("light", 250, 20);
    submit(&exec, &f, light);
    // Two blocks are more than a quarter of the budget: never runs.
    let (large, _rx) = tenant_request("light", 250, 50);
    match exec.check_share(&f.checkpoint, &large, 1) {
        Err(SubmitError::TenantKvShare {
            fanout: 1,
            permille: 250,
            ..
        }) => {}
        other => panic!("expected a tenant share refusal, got {other:?}"),
    }
    // Read every stream at once: the executor hands each event over in turn.
    let readers: Vec<_> = waiting
        .into_iter()
        .chain([light_rx])
        .map(|rx| std::thread::spawn(move || finish(&rx)))
        .collect();
    assert_eq!(finish(&running_rx).1, FinishReason::Length);
    for reader in readers {
        assert_eq!(reader.join().unwrap(), (20, FinishReason::Length));
    }
    let pool = Arc::clone(exec.kv_pool());
    exec.shutdown();
    assert_eq!(pool.reserved_bytes(), 0);
}
on_each_device!(a_tenant_past_its_part_of_the_queue_is_refused_and_others_still_queue);
