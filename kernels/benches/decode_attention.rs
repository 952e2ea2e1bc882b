//! A decode step's attention alone, at depth, against a plain read of the
//! same bytes: SmolLM2-135M's shapes (30 layers, 9 query heads over 3 KV
//! heads of 64, F16 KV in blocks of 1,024 positions, the engine's default),
//! one query row per layer attending over `depth + 1` positions. At 4,096
//! the step's KV is 94 MB, past what the host's L3 keeps between steps, so
//! this is the KV stream the roofline bench's decode reads, without the
//! weight products beside it.
//!
//! Each round times the attention step (every layer once, repeated for at
//! least 300 ms) and a plain AVX-512 read of a buffer of as many bytes on
//! as many threads (6 GB a timing), before and after it; it prints the median and range over rounds
//! of each one's GB/s and the attention's share of the read.
//!
//! `cargo bench -p switchyard-kernels --bench decode_attention -- [depth] [threads] [rounds] [layers]`
//! (defaults 4096, 2, 7, 30; one layer's 3 MB stays in cache, which shows
//! the kernel's rate with the KV close at hand). The KV's contents are one prompt-filled block
//! copied into every block (`kv_copy`): what is read is real, what it
//! holds does not matter to the time.

#[path = "plain_read/mod.rs"]
mod plain_read;

use std::time::{Duration, Instant};

use plain_read::{plain_read, spread};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::cpu::{CpuActivations, CpuBackend};
use switchyard_kernels::{
    AttentionRows, AttentionShape, Backend, BlockTable, KvFormat, KvLayout, KvType,
};

const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const MIN_MEASURED: Duration = Duration::from_millis(300);
/// Bytes each timing of the plain read covers at least.
const MIN_READ_BYTES: usize = 6_000_000_000;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .filter(|a| !a.starts_with('-'))
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn random(rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> CpuActivations {
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    CpuActivations::from_values(rows, cols, &values).expect("rows × cols values")
}

fn main() {
    let depth = arg(1, 4096);
    let threads = arg(2, 2);
    let rounds = arg(3, 7).max(1);
    let layers = arg(4, 30).max(1);
    let backend = CpuBackend::new(threads);
    let kv_cols = KV_HEADS * HEAD_DIM;
    let shape = AttentionShape {
        n_heads: HEADS,
        n_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        window: None,
        softcap: None,
    };
    let format = KvFormat::of(KvType::F16);
    let layout = KvLayout::new(format, layers, KV_HEADS, HEAD_DIM, depth + 1, &[])
        .expect("SmolLM2's cache layout");
    let mut store = backend
        .kv_store(format, usize::MAX)
        .expect("a CPU KV store");
    let mut table = BlockTable::new(layout.clone());
    let block = layout.block_shape(layout.block_positions());
    for l in 0..layers {
        while table.layer(l).len() < table.blocks_for(l, depth + 1) {
            let id = backend.kv_alloc(&mut store, block).expect("a block");
            table.push(l, id).expect("a block for the layer");
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    // Layer 0's first block from a prompt, then copied into every block.
    let fill = layout.block_positions().min(depth.max(1));
    let (q, k, v) = (
        random(&mut rng, fill, HEADS * HEAD_DIM),
        random(&mut rng, fill, kv_cols),
        random(&mut rng, fill, kv_cols),
    );
    let mut out = backend.activations(fill, HEADS * HEAD_DIM);
    let rows = [AttentionRows {
        table: &table,
        rows: 0..fill,
        start_pos: 0,
        prompt: true,
    }];
    backend
        .attention(0, shape, &q, &k, &v, &mut store, &rows, &mut out)
        .expect("the prompt block");
    let first = table.layer(0)[0];
    for l in 0..layers {
        for &id in table.layer(l) {
            if id != first {
                backend
                    .kv_copy(&mut store, first, id, fill)
                    .expect("a block's copy");
            }
        }
    }
    let (q, k, v) = (
        random(&mut rng, 1, HEADS * HEAD_DIM),
        random(&mut rng, 1, kv_cols),
        random(&mut rng, 1, kv_cols),
    );
    let mut out = backend.activations(1, HEADS * HEAD_DIM);
    let rows = [AttentionRows {
        table: &table,
        rows: 0..1,
        start_pos: depth,
        prompt: false,
    }];
    let step_bytes = layers * (depth + 1) * kv_cols * 2 * 2;
    let buffer = vec![1u8; step_bytes];
    let (mut att, mut plain, mut share) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let before = plain_read(&buffer, threads, MIN_READ_BYTES);
        let start = Instant::now();
        let mut steps = 0usize;
        while start.elapsed() < MIN_MEASURED {
            for l in 0..layers {
                backend
                    .attention(l, shape, &q, &k, &v, &mut store, &rows, &mut out)
                    .expect("a decode step's attention");
            }
            steps += 1;
        }
        let gbs = (steps * step_bytes) as f64 / start.elapsed().as_secs_f64() / 1e9;
        let after = plain_read(&buffer, threads, MIN_READ_BYTES);
        let read = (before + after) / 2.0;
        att.push(gbs);
        plain.push(read);
        share.push(100.0 * gbs / read);
    }
    println!(
        "decode attention, depth {depth}, {threads} threads, {:.1} MB of F16 KV a step, {rounds} rounds:",
        step_bytes as f64 / 1e6
    );
    println!(
        "  attention GB/s {}  ({:.2} ms a step at the median)",
        spread(att.clone()),
        {
            let mut a = att.clone();
            a.sort_by(f64::total_cmp);
            step_bytes as f64 / a[a.len() / 2] / 1e6
        }
    );
    println!("  plain read GB/s {}", spread(plain));
    println!("  share %         {}", spread(share));
}
