//! KV memory of a Gemma 3 270M sequence up to its 32k context: the 15
//! local layers (window 512) hold only their ring of blocks, the 3 global
//! ones grow with the context; and the ring still holds the last window.
//! (Issue 23: "sliding-window layers keep only their window's blocks".)

use half::f16;

use super::kv_cache::CpuKvCache;
use crate::kv::{KvFormat, KvType, DEFAULT_BLOCK_POSITIONS as KV_BLOCK, RING_SLACK};
use crate::KernelError;

/// Gemma 3 270M as its GGUF declares it.
const LAYERS: usize = 18;
const N_KV_HEADS: usize = 1;
const HEAD_DIM: usize = 256;
const WINDOW: usize = 512;
/// Every sixth layer is global (5, 11, 17).
const PATTERN: usize = 6;
const CONTEXT: usize = 32_768;

fn windows() -> Vec<Option<usize>> {
    (0..LAYERS)
        .map(|l| (l % PATTERN != PATTERN - 1).then_some(WINDOW))
        .collect()
}

/// A tag for position `p` that f16 holds exactly.
fn tag(p: usize) -> f32 {
    (p % 2039) as f32
}

#[test]
fn gemma3_local_layers_keep_their_ring_up_to_32k() -> Result<(), KernelError> {
    let pool = KvFormat::of(KvType::F16);
    let windows = windows();
    let mut cache = CpuKvCache::windowed(&pool, LAYERS, N_KV_HEADS, HEAD_DIM, CONTEXT, &windows)?;
    let block_bytes = 2 * KV_BLOCK * N_KV_HEADS * HEAD_DIM * 2;
    let ring = (WINDOW + RING_SLACK).div_ceil(KV_BLOCK);
    assert_eq!((ring, block_bytes), (1, 1 << 20));
    // The most it may ever hold, reserved up front: 116.4 MB, where every
    // layer growing to 32k would be 604 MB.
    let most = (15 * ring + 3 * CONTEXT / KV_BLOCK) * block_bytes;
    assert_eq!(cache.layout().bytes_beyond(0), most);

    // The bench's depths plus its 128 prompt and 32 decode tokens, fed in
    // chunks of 128 rows (a windowed layer's prompt piece).
    let checkpoints = [160, 1184, 4256, 16_544, 32_160, CONTEXT];
    let (mut key, mut value) = (vec![0.0f32; HEAD_DIM], vec![0.0f32; HEAD_DIM]);
    let mut written = 0;
    for end in checkpoints {
        while written < end {
            let chunk_end = (written + 128).min(end);
            cache.grow(chunk_end)?;
            for layer in 0..LAYERS {
                for p in written..chunk_end {
                    (key[0], value[0]) = (tag(p), -tag(p));
                    cache.write::<f16>(layer, p, &key, &value)?;
                }
            }
            written = chunk_end;
        }
        let blocks = end.div_ceil(KV_BLOCK);
        for (layer, window) in windows.iter().enumerate() {
            let want = match window {
                Some(_) => blocks.min(ring),
                None => blocks,
            };
            assert_eq!(
                cache.layer_allocated_bytes(layer),
                want * block_bytes,
                "layer {layer} at {end} positions"
            );
        }
        let want = (15 * blocks.min(ring) + 3 * blocks) * block_bytes;
        assert_eq!(cache.allocated_bytes(), want, "{end} positions");
        assert!(cache.allocated_bytes() <= cache.layout().bytes_beyond(0));
    }

    // After 64 turns of the ring, a local layer still holds its last
    // window, and a global layer its first position.
    for p in CONTEXT - WINDOW..CONTEXT {
        assert_eq!(cache.key(0, 0, p)[0], tag(p), "local key at {p}");
        assert_eq!(cache.value(0, 0, p)[0], -tag(p), "local value at {p}");
    }
    assert_eq!(cache.key(5, 0, 0)[0], tag(0));
    assert_eq!(cache.key(17, 0, 1)[0], tag(1));
    Ok(())
}
