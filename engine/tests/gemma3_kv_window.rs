//! The real Gemma 3 270M keeps, at its 32k context, only the KV the sliding
//! window implies (issue 23): its 15 local layers (window 512) hold a ring
//! of blocks however long the sequence, only its 3 global layers grow.
//!
//! The sequence is fed through the model (prompt chunks and decode steps,
//! as `benches/long_context.rs` does) to 2,048 tokens, four windows: far
//! enough for every ring to have turned, short enough for a test. What 32k
//! would hold follows from the reservation, which a cache never exceeds.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

#[path = "support/real_models.rs"]
mod real_models;

use std::sync::Arc;

use switchyard_engine::formats::load_checkpoint;
use switchyard_engine::kv::{KvConfig, KvPool};
use switchyard_engine::model::{LlamaModel, LogitRows};
use switchyard_engine::session::Session;
use switchyard_kernels::{on_each_device, Backend, KvType};

/// Positions per KV block and per-block bytes of one Gemma 3 270M layer
/// (1 KV head × 256 dims, keys and values, f16).
const KV_BLOCK: usize = 1024;
const BLOCK_BYTES: usize = 2 * KV_BLOCK * 256 * 2;

fn gemma3_local_layers_hold_a_ring_only_the_global_ones_grow<B: Backend>(backend: Arc<B>) {
    let checkpoint = load_checkpoint(&real_models::gemma3()).unwrap();
    let backend = &*backend;
    let kv = KvPool::new(KvConfig {
        dtype: KvType::F16,
        ..KvConfig::default()
    });
    let model = LlamaModel::load(backend, &checkpoint).unwrap();
    let windows = model.config().layer_windows();
    let globals: Vec<usize> = (0..windows.len())
        .filter(|l| windows[*l].is_none())
        .collect();
    assert_eq!(globals, [5, 11, 17]);
    assert!(windows.iter().flatten().all(|w| *w == 512));
    assert_eq!(
        (model.config().n_kv_heads, model.config().head_dim),
        (1, 256)
    );

    let context = model.config().context_length;
    assert_eq!(context, 32_768);
    let mut session = Session::with_kv(backend, &model, &kv, context).unwrap();
    // A ring of the window plus a prompt piece's slack (128): one block.
    let ring = 1;
    // Everything 32k will ever take: 116.4 MB, against 604 MB were every
    // layer to grow.
    let most = (15 * ring + 3 * context / KV_BLOCK) * BLOCK_BYTES;
    assert_eq!(session.cache().reserved_bytes(), most);

    let ids = |from: usize, n: usize| -> Vec<u32> {
        (from..from + n)
            .map(|i| 100 + (i as u32 * 7919) % 48_000)
            .collect()
    };
    let mut fed = 0;
    for (prompt, decode) in [(400, 8), (1000, 8), (600, 32)] {
        session.feed(&ids(fed, prompt), LogitRows::None).unwrap();
        fed += prompt;
        for id in ids(fed, decode) {
            session.decode(&[id], LogitRows::Last).unwrap();
        }
        fed += decode;
        let blocks = fed.div_ceil(KV_BLOCK);
        let reserved = session.cache().reserved_bytes();
        let cache = session.cache();
        for (layer, window) in windows.iter().enumerate() {
            let want = if window.is_some() {
                blocks.min(ring)
            } else {
                blocks
            };
            assert_eq!(
                cache.layer_allocated_bytes(layer),
                want * BLOCK_BYTES,
                "layer {layer} after {fed} tokens"
            );
        }
        assert!(cache.allocated_bytes() <= reserved);
    }
    assert_eq!(fed, 2048);
}
on_each_device!(gemma3_local_layers_hold_a_ring_only_the_global_ones_grow);
