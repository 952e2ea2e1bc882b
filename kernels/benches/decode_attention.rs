//! A decode step's attention alone, at depth, against a plain read of the
//! same bytes, in a real model's shapes ([`MODELS`]): SmolLM2-135M (30
//! layers, 9 query heads over 3 KV heads of 64) or Gemma 3 270M (18
//! layers, 4 query heads over one KV head of 256; 15 layers with a
//! 512-position sliding window in a ring, every sixth layer global). F16 KV
//! in blocks of 1,024 positions (the engine's default), one query row per
//! layer at position `depth`: a global layer reads `depth + 1` positions,
//! a windowed one at most its window. At 4,096 SmolLM2's step reads 94 MB
//! of KV, Gemma 3's 20 MB.
//!
//! Each round times the attention step (every layer once, repeated for at
//! least 300 ms) and a plain AVX-512 read of a buffer of as many bytes on
//! as many threads (6 GB a timing), before and after it; it prints the
//! median and range over rounds of each one's GB/s and the attention's
//! share of the read. A model with both kinds of layer also times each
//! kind's layers alone in the same round (µs a step).
//!
//! `cargo bench -p switchyard-kernels --bench decode_attention -- [depth] [threads] [rounds] [layers] [model]`
//! (defaults 4096, 2, 7, the model's layers, `smollm2`; `gemma3` for
//! Gemma 3; one SmolLM2 layer's 3 MB stays in cache, which shows the
//! kernel's rate with the KV close at hand). The KV's contents are one
//! prompt-filled block copied into every block (`kv_copy`): what is read
//! is real, what it holds does not matter to the time.

#[path = "plain_read/mod.rs"]
mod plain_read;

use std::time::{Duration, Instant};

use plain_read::{plain_read, spread};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::cpu::{CpuActivations, CpuBackend};
use switchyard_kernels::kv::KV_UNIT;
use switchyard_kernels::{
    AttentionRows, AttentionShape, Backend, BlockTable, KvFormat, KvLayout, KvType,
};

/// A model's attention shapes, as its checkpoint gives them.
struct Model {
    name: &'static str,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// The sliding window of the windowed layers, and every how many
    /// layers one is global (the last of each group, as Gemma 3's
    /// `sliding_window_pattern`).
    window: Option<(usize, usize)>,
}

const MODELS: [Model; 2] = [
    Model {
        name: "smollm2",
        layers: 30,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        window: None,
    },
    Model {
        name: "gemma3",
        layers: 18,
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        window: Some((512, 6)),
    },
];

impl Model {
    fn window(&self, layer: usize) -> Option<usize> {
        self.window
            .filter(|(_, every)| !(layer + 1).is_multiple_of(*every))
            .map(|(w, _)| w)
    }

    fn shape(&self, layer: usize) -> AttentionShape {
        AttentionShape {
            n_heads: self.heads,
            n_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            window: self.window(layer),
            softcap: None,
        }
    }

    /// Bytes of F16 keys and values layer `layer` reads at `depth`.
    fn bytes(&self, layer: usize, depth: usize) -> usize {
        let positions = self.window(layer).map_or(depth + 1, |w| w.min(depth + 1));
        positions * self.kv_heads * self.head_dim * 2 * 2
    }
}

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
    let name = std::env::args()
        .filter(|a| !a.starts_with('-'))
        .nth(5)
        .unwrap_or_else(|| "smollm2".into());
    let Some(model) = MODELS.iter().find(|m| m.name == name) else {
        eprintln!("unknown model {name}: smollm2 or gemma3");
        std::process::exit(2);
    };
    let layers = arg(4, model.layers).max(1);
    let backend = CpuBackend::new(threads);
    let (q_cols, kv_cols) = (
        model.heads * model.head_dim,
        model.kv_heads * model.head_dim,
    );
    let format = KvFormat::of(KvType::F16);
    let windows: Vec<Option<usize>> = (0..layers).map(|l| model.window(l)).collect();
    let layout = KvLayout::new(
        format,
        layers,
        model.kv_heads,
        model.head_dim,
        depth + 1,
        &windows,
    )
    .expect("the model's cache layout");
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
    // Layer 0's first block from a prompt, then copied into every block
    // (whole units of `KV_UNIT` positions, as copies go).
    let fill = layout
        .block_positions()
        .min((depth + 1) / KV_UNIT * KV_UNIT)
        .max(KV_UNIT);
    let (q, k, v) = (
        random(&mut rng, fill, q_cols),
        random(&mut rng, fill, kv_cols),
        random(&mut rng, fill, kv_cols),
    );
    let mut out = backend.activations(fill, q_cols);
    let rows = [AttentionRows {
        table: &table,
        rows: 0..fill,
        start_pos: 0,
        prompt: true,
    }];
    backend
        .attention(0, model.shape(0), &q, &k, &v, &mut store, &rows, &mut out)
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
        random(&mut rng, 1, q_cols),
        random(&mut rng, 1, kv_cols),
        random(&mut rng, 1, kv_cols),
    );
    let mut out = backend.activations(1, q_cols);
    let rows = [AttentionRows {
        table: &table,
        rows: 0..1,
        start_pos: depth,
        prompt: false,
    }];
    // Steps of `layers` a second, each step every layer once.
    let mut steps_per_s = |layers: &[usize]| {
        let start = Instant::now();
        let mut steps = 0usize;
        while start.elapsed() < MIN_MEASURED {
            for &l in layers {
                backend
                    .attention(l, model.shape(l), &q, &k, &v, &mut store, &rows, &mut out)
                    .expect("a decode step's attention");
            }
            steps += 1;
        }
        steps as f64 / start.elapsed().as_secs_f64()
    };
    let all: Vec<usize> = (0..layers).collect();
    let (windowed, global): (Vec<usize>, Vec<usize>) =
        all.iter().partition(|&&l| model.window(l).is_some());
    let kinds = !windowed.is_empty() && !global.is_empty();
    let step_bytes: usize = all.iter().map(|&l| model.bytes(l, depth)).sum();
    let buffer = vec![1u8; step_bytes];
    let (mut att, mut plain, mut share) = (Vec::new(), Vec::new(), Vec::new());
    let (mut windowed_us, mut global_us) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let before = plain_read(&buffer, threads, MIN_READ_BYTES);
        let gbs = steps_per_s(&all) * step_bytes as f64 / 1e9;
        if kinds {
            windowed_us.push(1e6 / steps_per_s(&windowed));
            global_us.push(1e6 / steps_per_s(&global));
        }
        let after = plain_read(&buffer, threads, MIN_READ_BYTES);
        let read = (before + after) / 2.0;
        att.push(gbs);
        plain.push(read);
        share.push(100.0 * gbs / read);
    }
    println!(
        "decode attention, {}, depth {depth}, {threads} threads, {layers} layers, \
         {:.1} MB of F16 KV a step, {rounds} rounds:",
        model.name,
        step_bytes as f64 / 1e6
    );
    println!(
        "  attention GB/s {}  ({:.0} µs a step at the median)",
        spread(att.clone()),
        {
            let mut a = att.clone();
            a.sort_by(f64::total_cmp);
            step_bytes as f64 / a[a.len() / 2] / 1e3
        }
    );
    println!("  plain read GB/s {}", spread(plain));
    println!("  share %         {}", spread(share));
    if kinds {
        println!(
            "  {} windowed layers alone, µs a step {}",
            windowed.len(),
            spread(windowed_us)
        );
        println!(
            "  {} global layers alone, µs a step   {}",
            global.len(),
            spread(global_us)
        );
    }
}
