//! The prompt cache through the executor (issue 20): a prompt that starts
//! like an earlier one runs from the cached blocks and samples exactly what
//! it samples with the cache off, and cached blocks that no sequence reads
//! give way to a new sequence's cache instead of refusing it; checkpoints
//! with sliding-window layers are cached with their windows' rings.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/requests.rs"]
mod requests;

#[path = "support/served.rs"]
mod served;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::KvConfig;
use switchyard_engine::model::LlamaModel;
use switchyard_engine::serving::{CheckpointHandle, Executor, ExecutorConfig, ExecutorObserver};
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::DType;
use switchyard_kernels::KvType;
use switchyard_kernels::{on_each_device, Backend};

/// Positions per KV block: the smallest the backend takes, so that the
/// synthetic model's 256-position context holds several.
const BLOCK: usize = 32;

struct Fixture<B: Backend> {
    backend: Arc<B>,
    /// The executor's KV settings.
    kv: KvConfig,
    checkpoint: CheckpointHandle<B>,
    _dir: tempfile::TempDir,
}

/// A synthetic SmolLM2 on a backend whose F16 KV budget holds
/// `budget_blocks` blocks of every layer (`None`: no limit).
fn fixture<B: Backend>(backend: &Arc<B>, budget_blocks: Option<usize>) -> Fixture<B> {
    fixture_of(backend, Preset::Smollm2, budget_blocks, BLOCK)
}

/// As [`fixture`], of another architecture and block size.
fn fixture_of<B: Backend>(
    backend: &Arc<B>,
    preset: Preset,
    budget_blocks: Option<usize>,
    block: usize,
) -> Fixture<B> {
    let backend = Arc::clone(backend);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("synthetic-q8.gguf");
    let spec = SyntheticSpec {
        preset,
        dtype: DType::Q8_0,
        seed: 5,
    };
    write_gguf(&spec, &path).unwrap();
    let checkpoint = load_checkpoint(&path).unwrap();
    let config = LlamaModel::load(&*backend, &checkpoint)
        .unwrap()
        .config()
        .clone();
    let block_bytes = config.n_layers * config.n_kv_heads * config.head_dim * 2 * block * 2;
    let kv = KvConfig {
        dtype: KvType::F16,
        budget_bytes: budget_blocks.map_or(usize::MAX, |b| b * block_bytes),
        block_positions: block,
    };
    let checkpoint = served::serve(&*backend, &path);
    Fixture {
        backend,
        kv,
        checkpoint,
        _dir: dir,
    }
}

/// Runs `prompt` greedily for `max_tokens`: the sampled ids and the
/// prompt tokens the cache supplied.
fn run<B: Backend>(
    exec: &Executor<B>,
    f: &Fixture<B>,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> (Vec<u32>, usize) {
    let (request, receiver) = requests::on_channel(prompt, max_tokens);
    exec.submit(&f.checkpoint, request).unwrap();
    let finished = requests::finish(&receiver);
    (finished.ids, finished.cached_tokens)
}

/// Counts the cached blocks evicted.
#[derive(Default)]
struct Evictions(AtomicUsize);

impl ExecutorObserver for Evictions {
    fn prompt_cache_evicted(&self, blocks: usize) {
        self.0.fetch_add(blocks, Ordering::AcqRel);
    }
}

fn executor_observed<B: Backend>(
    f: &Fixture<B>,
    prompt_cache: bool,
    observer: Arc<Evictions>,
) -> Executor<B> {
    let config = ExecutorConfig {
        max_step_tokens: 64,
        prompt_cache,
        kv: f.kv,
        ..ExecutorConfig::default()
    };
    Executor::spawn(f.backend.clone(), config, observer).unwrap()
}

fn executor<B: Backend>(f: &Fixture<B>, prompt_cache: bool) -> Executor<B> {
    executor_observed(f, prompt_cache, Arc::default())
}

/// A shared 100-token start, then `tail`.
fn prompt(tail: &[u32]) -> Vec<u32> {
    prompt_of(100, tail)
}

/// A shared start of `start` tokens, then `tail`.
fn prompt_of(start: u32, tail: &[u32]) -> Vec<u32> {
    (0..start)
        .map(|i| 1 + (i * 37) % 300)
        .chain(tail.iter().copied())
        .collect()
}

fn a_cached_prefix_samples_what_the_whole_prompt_samples<B: Backend>(backend: Arc<B>) {
    let f = fixture(&backend, None);
    let tails: [&[u32]; 3] = [&[7, 8, 9], &[11, 12], &[200, 201, 202, 203, 204]];
    let uncached = executor(&f, false);
    let expected: Vec<_> = tails
        .iter()
        .map(|t| run(&uncached, &f, prompt(t), 8))
        .collect();
    uncached.shutdown();
    assert!(expected.iter().all(|(_, cached)| *cached == 0));

    let cached = executor(&f, true);
    let (first, hit) = run(&cached, &f, prompt(tails[0]), 8);
    assert_eq!((first, hit), (expected[0].0.clone(), 0));
    for (tail, (ids, _)) in tails.iter().zip(&expected) {
        let (got, hit) = run(&cached, &f, prompt(tail), 8);
        assert_eq!(&got, ids, "tail {tail:?}");
        // The shared start's 3 full blocks (the 4th holds the tail).
        assert_eq!(hit, 3 * BLOCK, "tail {tail:?}");
    }
    // A prompt of whole blocks recomputes its last block: there must be
    // logits for its last token.
    let whole: Vec<u32> = prompt(&[]).into_iter().take(3 * BLOCK).collect();
    let (_, hit) = run(&cached, &f, whole, 4);
    assert_eq!(hit, 2 * BLOCK);
}
on_each_device!(a_cached_prefix_samples_what_the_whole_prompt_samples);

fn a_copied_tail_samples_what_the_whole_prompt_samples<B: Backend>(backend: Arc<B>) {
    // Blocks of 128 positions: a start of 100 tokens lies in a block's
    // first 3 key blocks (96 positions, copied); one of 200 fills block 0
    // (shared) and 2 key blocks of block 1 (64 positions, copied).
    const LARGE: usize = 128;
    let f = fixture_of(&backend, Preset::Smollm2, None, LARGE);
    let tails: [&[u32]; 3] = [&[7, 8, 9], &[11, 12], &[200, 201, 202, 203, 204]];
    for (start, copied) in [(100, 96), (200, LARGE + 64)] {
        let uncached = executor(&f, false);
        let expected: Vec<_> = tails
            .iter()
            .map(|t| run(&uncached, &f, prompt_of(start, t), 8).0)
            .collect();
        uncached.shutdown();
        let cached = executor(&f, true);
        let (first, hit) = run(&cached, &f, prompt_of(start, tails[0]), 8);
        assert_eq!((first, hit), (expected[0].clone(), 0));
        for (tail, ids) in tails.iter().zip(&expected) {
            let (got, hit) = run(&cached, &f, prompt_of(start, tail), 8);
            assert_eq!(&got, ids, "start {start}, tail {tail:?}");
            assert_eq!(hit, copied, "start {start}, tail {tail:?}");
        }
        cached.shutdown();
    }
}
on_each_device!(a_copied_tail_samples_what_the_whole_prompt_samples);

fn unread_cached_blocks_give_way_to_a_new_sequence<B: Backend>(backend: Arc<B>) {
    // Eight blocks of every layer: the first sequence (4 blocks) leaves 3
    // cached; the second (100 + 100 positions: 7 blocks) fits only if
    // some of those go. Nothing else runs, so without eviction it would
    // be refused.
    let f = fixture(&backend, Some(8));
    let evictions = Arc::new(Evictions::default());
    let exec = executor_observed(&f, true, evictions.clone());
    let (_, hit) = run(&exec, &f, prompt(&[1]), 4);
    assert_eq!(hit, 0);
    let other: Vec<u32> = (0..100u32).map(|i| 2 + (i * 53) % 300).collect();
    let (ids, hit) = run(&exec, &f, other, 100);
    assert_eq!(hit, 0);
    assert!(!ids.is_empty());
    assert!(evictions.0.load(Ordering::Acquire) >= 2);
}
on_each_device!(unread_cached_blocks_give_way_to_a_new_sequence);

fn sliding_window_checkpoints_are_cached_where_their_windows_were_kept<B: Backend>(
    backend: Arc<B>,
) {
    // Gemma 3's local layers keep rings (here a window of 16 in 5 blocks
    // of 32) whose blocks are overwritten as the window moves: a prefix is
    // reused from a copy of the rings where the first prompt ended, the
    // global layers' blocks shared. A start of 100 tokens leaves the rings
    // unturned; one of 200 turns them (201 positions in 160 slots).
    let f = fixture_of(&backend, Preset::Gemma3, None, BLOCK);
    let tails: [&[u32]; 3] = [&[3], &[5, 6, 7], &[9]];
    for start in [100, 200] {
        let uncached = executor(&f, false);
        let expected: Vec<_> = tails
            .iter()
            .map(|t| run(&uncached, &f, prompt_of(start, t), 6))
            .collect();
        uncached.shutdown();
        let cached = executor(&f, true);
        let (first, hit) = run(&cached, &f, prompt_of(start, tails[0]), 6);
        assert_eq!((first, hit), (expected[0].0.clone(), 0), "start {start}");
        for (tail, (ids, _)) in tails.iter().zip(&expected) {
            let (got, hit) = run(&cached, &f, prompt_of(start, tail), 6);
            assert_eq!(&got, ids, "start {start}, tail {tail:?}");
            // The shared start's full blocks.
            assert_eq!(
                hit,
                start as usize / BLOCK * BLOCK,
                "start {start}, tail {tail:?}"
            );
        }
        cached.shutdown();
    }
}
on_each_device!(sliding_window_checkpoints_are_cached_where_their_windows_were_kept);

fn a_window_snapshot_serves_a_cache_of_another_size<B: Backend>(backend: Arc<B>) {
    // A cache shorter than a block is one block of its own size (rounded
    // up to a KV unit): the same prompt asked for 6 and for 60 tokens has
    // rings of 64 and of 128 slots. Where the first prompt left its rings
    // unturned (41 positions), a cache of either size starts from the
    // other's snapshot: each written position is at the same slot in both.
    let f = fixture_of(&backend, Preset::Gemma3, None, 1024);
    let asks = [6, 60, 6];
    let uncached = executor(&f, false);
    let expected: Vec<_> = asks
        .iter()
        .map(|&m| run(&uncached, &f, prompt_of(40, &[3]), m).0)
        .collect();
    uncached.shutdown();
    let cached = executor(&f, true);
    for (i, (&m, ids)) in asks.iter().zip(&expected).enumerate() {
        let (got, hit) = run(&cached, &f, prompt_of(40, &[3]), m);
        assert_eq!(&got, ids, "ask {i}: {m} tokens");
        assert!(i == 0 || hit > 0, "ask {i} started from the cache: {hit}");
    }
    cached.shutdown();
}
on_each_device!(a_window_snapshot_serves_a_cache_of_another_size);
