//! Llama-7B shapes on the GPU: a decode step captured as a CUDA graph and
//! replayed across pointer-table swaps between two checkpoints, and the
//! backend's decode tokens/s at batch 1/16/64 (compared in the report with
//! `transformers` on the same weights, exported as safetensors F16:
//! `llama.rs`, `scripts/gpu_check_torch.py`), eager and as the serving
//! path runs it with step graphs (captured at a key's second step, replayed
//! after; logits equal to the eager step's).
//!
//! Weights are random: speed does not depend on their values, and the
//! graph check compares each replay with an eager run of the same
//! checkpoint, bit for bit.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaSlice;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::cuda::graph_cache::{GraphCache, Lookup, StepShape};
use switchyard_kernels::cuda::ops::{self, MatvecInput};
use switchyard_kernels::cuda::ops_layers::{self, Elementwise};
use switchyard_kernels::cuda::{
    CudaBackend, CudaConfig, CudaDevice, CudaMemory, DeviceMemory, PointerTable,
};
use switchyard_kernels::{DType, StepKey};

use super::llama::{write_logits, Model, Weights, LLAMA_7B, PROMPT, SEED};
use super::Check;

const LAYERS: usize = LLAMA_7B.layers;
const D: usize = LLAMA_7B.d;
const FF: usize = LLAMA_7B.ff;

/// A layer's matrices: (name, rows, cols).
const MATRICES: [(&str, usize, usize); 7] = [
    ("q", D, D),
    ("k", D, D),
    ("v", D, D),
    ("o", D, D),
    ("gate", FF, D),
    ("up", FF, D),
    ("down", D, FF),
];

/// Random Q4_K blocks whose two f16 scales are small and finite, so that
/// every product is a finite number.
fn random_q4k(rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; DType::Q4K.bytes_for(cols).unwrap_or(0) * rows];
    rng.fill_bytes(&mut bytes);
    let scale = half::f16::from_f32(1e-3).to_le_bytes();
    for block in bytes.chunks_exact_mut(DType::Q4K.block_bytes()) {
        block[0..2].copy_from_slice(&scale);
        block[2..4].copy_from_slice(&scale);
    }
    bytes
}

/// Buffers of one decode step (batch 1), allocated before capture.
struct Step {
    h: CudaSlice<f32>,
    n: CudaSlice<f32>,
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    g: CudaSlice<f32>,
    u: CudaSlice<f32>,
    q: CudaSlice<i8>,
    ds: CudaSlice<f32>,
    /// Norm weights of ones, named through one-slot tables (kept here).
    ones_d: ops_layers::WeightRef,
    ones_ff: ops_layers::WeightRef,
    _tables: Vec<CudaSlice<u64>>,
    _ones: Vec<CudaSlice<f32>>,
}

/// The step: per layer, normalize → Q, K, V → normalize → O into the
/// residual; normalize → gate, up → SwiGLU → normalize → down into the
/// residual (the norms keep random weights' activations finite). Launches
/// only: capturable.
fn step(device: &CudaDevice, table: u64, s: &mut Step) -> Result<(), Box<dyn std::error::Error>> {
    let q4 = DType::Q4K;
    for layer in 0..LAYERS {
        let slot = |i: usize| (layer * MATRICES.len() + i) as u32;
        ops_layers::rms_norm(device, &s.h, s.ones_d, 1e-5, &mut s.n, 1, D)?;
        ops::quantize_q8_1(device, &s.n, 1, D, &mut s.q, &mut s.ds)?;
        for (i, out) in [0usize, 1, 2].into_iter().zip([0, 1, 1]) {
            let out = if out == 0 { &mut s.a } else { &mut s.b };
            let input = MatvecInput::Quantized { q: &s.q, ds: &s.ds };
            ops::matvec(device, table, slot(i), q4, input, out, D, D, 1, i == 2)?;
        }
        ops_layers::rms_norm(device, &s.a, s.ones_d, 1e-5, &mut s.n, 1, D)?;
        ops::quantize_q8_1(device, &s.n, 1, D, &mut s.q, &mut s.ds)?;
        let input = MatvecInput::Quantized { q: &s.q, ds: &s.ds };
        ops::matvec(device, table, slot(3), q4, input, &mut s.h, D, D, 1, true)?;
        ops_layers::rms_norm(device, &s.h, s.ones_d, 1e-5, &mut s.n, 1, D)?;
        ops::quantize_q8_1(device, &s.n, 1, D, &mut s.q, &mut s.ds)?;
        let input = MatvecInput::Quantized { q: &s.q, ds: &s.ds };
        ops::matvec(device, table, slot(4), q4, input, &mut s.g, FF, D, 1, false)?;
        let input = MatvecInput::Quantized { q: &s.q, ds: &s.ds };
        ops::matvec(device, table, slot(5), q4, input, &mut s.u, FF, D, 1, false)?;
        ops_layers::elementwise(device, &mut s.g, Elementwise::SiluMul(&s.u))?;
        ops_layers::rms_norm(device, &s.g, s.ones_ff, 1e-5, &mut s.u, 1, FF)?;
        ops::quantize_q8_1(device, &s.u, 1, FF, &mut s.q, &mut s.ds)?;
        let input = MatvecInput::Quantized { q: &s.q, ds: &s.ds };
        ops::matvec(device, table, slot(6), q4, input, &mut s.h, D, FF, 1, true)?;
    }
    ops_layers::rms_norm(device, &s.h, s.ones_d, 1e-5, &mut s.n, 1, D)?;
    Ok(())
}

/// Two Llama-7B-shaped Q4_K checkpoints (224 matrices each); one decode
/// step captured once as a graph; the table swapped `swaps` times, each
/// swap followed by a replay whose output must equal that checkpoint's
/// eager step bit for bit (swap p50/p99, replay p50).
pub fn graph_swaps(device: &CudaDevice, swaps: usize) -> Check {
    let stream = device.stream();
    // SAFETY: all work runs in order on the one stream, so cudarc's
    // per-buffer events (which a capture must not wait on) are not needed.
    unsafe { device.context().disable_event_tracking() };
    let mem = CudaMemory::new(stream.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(70);
    let slots = LAYERS * MATRICES.len();
    let mut weights = Vec::new();
    let mut entries: Vec<Vec<u64>> = Vec::new();
    for _ in 0..2 {
        let mut e = Vec::with_capacity(slots);
        for _ in 0..LAYERS {
            for (_, rows, cols) in MATRICES {
                let bytes = random_q4k(&mut rng, rows, cols);
                let mut buf = mem.alloc(bytes.len())?;
                mem.write(&mut buf, 0, &bytes)?;
                e.push(mem.address(&buf));
                weights.push(buf);
            }
        }
        entries.push(e);
    }
    let mut table = PointerTable::<usize, _>::new(&mem, slots)?;
    let address = table.address(&mem);
    let x: Vec<f32> = (0..D).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let x_d = stream.clone_htod(&x)?;
    let (ones_d, ones_ff) = (
        stream.clone_htod(&vec![1.0f32; D])?,
        stream.clone_htod(&vec![1.0f32; FF])?,
    );
    let (d_table, d_ref) = ops_layers::table_of(stream, &ones_d)?;
    let (ff_table, ff_ref) = ops_layers::table_of(stream, &ones_ff)?;
    let mut s = Step {
        h: stream.alloc_zeros(D)?,
        n: stream.alloc_zeros(D)?,
        a: stream.alloc_zeros(D)?,
        b: stream.alloc_zeros(D)?,
        g: stream.alloc_zeros(FF)?,
        u: stream.alloc_zeros(FF)?,
        q: stream.alloc_zeros(FF)?,
        ds: stream.alloc_zeros(FF / 16)?,
        ones_d: d_ref,
        ones_ff: ff_ref,
        _tables: vec![d_table, ff_table],
        _ones: vec![ones_d, ones_ff],
    };
    // Eager steps: each checkpoint's expected output (and every module loaded).
    let mut expected = Vec::new();
    for (id, e) in entries.iter().enumerate() {
        table.swap_to(&mem, &id, e)?;
        stream.memcpy_dtod(&x_d, &mut s.h)?;
        step(device, address, &mut s)?;
        expected.push(stream.clone_dtoh(&s.n)?);
    }
    if expected[0] == expected[1] || expected[0].iter().any(|v| !v.is_finite()) {
        return Err("the two checkpoints' steps are equal or not finite".into());
    }
    // Capture once (the input copy included), through the graph cache.
    let mut cache = GraphCache::new(1);
    let shape = StepShape {
        rows: 1,
        max_blocks: 0,
    };
    let addresses = vec![address];
    if matches!(cache.lookup(shape, &addresses), Lookup::Capture) {
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        stream.memcpy_dtod(&x_d, &mut s.h)?;
        let captured = step(device, address, &mut s);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
        captured?;
        let graph = graph.ok_or("the capture recorded nothing")?;
        graph.upload()?;
        cache.insert(shape, addresses.clone(), graph);
    }
    let (mut swap_us, mut step_us) = (Vec::with_capacity(swaps), Vec::with_capacity(swaps));
    let mut wrong = 0usize;
    for i in 0..swaps {
        let id = i % 2;
        let t = Instant::now();
        table.swap_to(&mem, &id, &entries[id])?;
        stream.synchronize()?;
        swap_us.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        match cache.lookup(shape, &addresses) {
            Lookup::Replay(graph) => graph.launch()?,
            Lookup::Capture => return Err("the graph was invalidated by a swap".into()),
        }
        let got = stream.clone_dtoh(&s.n)?;
        step_us.push(t.elapsed().as_secs_f64() * 1e6);
        if got != expected[id] {
            wrong += 1;
        }
    }
    let p = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v.get(((v.len().max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let bytes: usize = weights.iter().map(|w| w.len()).sum::<usize>() / 2;
    let step_p50 = p(&mut step_us, 0.5);
    let pass = wrong == 0 && cache.captures == 1;
    println!(
        "{{\"check\":\"graph_swaps_llama7b_q4k\",\"swaps\":{swaps},\"wrong_outputs\":{wrong},\"captures\":{},\"replays\":{},\"swap_us_p50\":{:.1},\"swap_us_p99\":{:.1},\"replay_us_p50\":{step_p50:.1},\"weight_gb_s\":{:.1},\"pass\":{pass}}}",
        cache.captures,
        cache.replays,
        p(&mut swap_us, 0.5),
        p(&mut swap_us, 0.99),
        bytes as f64 / (step_p50 * 1e-6) / 1e9
    );
    Ok(pass)
}

/// The backend's Llama-7B decode (F16 weights as `transformers` holds
/// them, the very weights `--export` writes for it: `llama.rs`): first the
/// logits check's run (`switchyard_logits.json` into `weights_dir`, which
/// `scripts/gpu_check_torch.py` recomputes), then per batch a 16-token
/// prompt per sequence and `steps` decode steps timed end to end (logits
/// copied back each step), eager and then keyed.
pub fn backend_decode(batches: &[usize], steps: usize, weights_dir: Option<&Path>) -> Check {
    let backend = Arc::new(CudaBackend::open(CudaConfig::default())?);
    let b = &*backend;
    let weights = Weights::generate(LLAMA_7B, SEED);
    let model = Model::upload(b, &weights)?;
    drop(weights);
    if let Some(dir) = weights_dir {
        let (tokens, rows) = model.reference_rows(b)?;
        write_logits(dir, &tokens, &rows)?;
    }
    let vocab = LLAMA_7B.vocab;
    let mut pass = true;
    for &batch in batches {
        let mut kv = model.batch(b, batch, PROMPT + steps + 1)?;
        // The prompt: every sequence's 16 tokens in one step (cuBLAS from
        // batch 3 on), then the timed decode steps: eager, then the same
        // steps again keyed (captured at the second, replayed after; KV
        // writes are the same values again), each step's logits equal to
        // the eager step's bit for bit.
        let tokens: Vec<u32> = (0..batch * PROMPT)
            .map(|i| (i * 7 % vocab) as u32)
            .collect();
        let positions: Vec<u32> = (0..batch * PROMPT).map(|i| (i % PROMPT) as u32).collect();
        let t = Instant::now();
        model.step(b, &mut kv, &tokens, &positions, PROMPT, None)?;
        let prefill_s = t.elapsed().as_secs_f64();
        let inputs: Vec<(Vec<u32>, Vec<u32>)> = (0..steps)
            .map(|s| {
                let tokens: Vec<u32> = (0..batch).map(|i| ((i + s) * 13 % vocab) as u32).collect();
                (tokens, vec![(PROMPT + s) as u32; batch])
            })
            .collect();
        let mut eager_logits = Vec::with_capacity(steps);
        let t = Instant::now();
        for (tokens, positions) in &inputs {
            eager_logits.push(model.step(b, &mut kv, tokens, positions, 1, None)?);
        }
        let secs = t.elapsed().as_secs_f64();
        let before = (backend.graph_stats(), backend.staged_bytes());
        let key = Some(StepKey(batch as u64));
        let mut wrong = 0;
        let t = Instant::now();
        for ((tokens, positions), expected) in inputs.iter().zip(&eager_logits) {
            wrong += usize::from(model.step(b, &mut kv, tokens, positions, 1, key)? != *expected);
        }
        let graph_secs = t.elapsed().as_secs_f64();
        let (stats, staged) = (backend.graph_stats(), backend.staged_bytes());
        let tokens_per_s = (batch * steps) as f64 / secs;
        let graph_tokens_per_s = (batch * steps) as f64 / graph_secs;
        // Up to 32 rows (the MMVQ kernels) a keyed step must replay; batch
        // 64 goes through cuBLAS, captured too since its workspace is fixed
        // at open, but only reported (its first run on a GPU will say).
        let captured = batch <= 32;
        let ok =
            wrong == 0 && tokens_per_s > 0.0 && (!captured || stats.replays > before.0.replays);
        pass &= ok;
        println!(
            "{{\"check\":\"switchyard_llama7b_decode\",\"dtype\":\"F16\",\"same_weights\":{},\"batch\":{batch},\"steps\":{steps},\"tokens_per_s\":{tokens_per_s:.1},\"step_ms\":{:.2},\"prefill_tokens_per_s\":{:.1}}}",
            weights_dir.is_some(),
            secs * 1e3 / steps as f64,
            (batch * PROMPT) as f64 / prefill_s
        );
        println!(
            "{{\"check\":\"switchyard_llama7b_decode_graphs\",\"batch\":{batch},\"steps\":{steps},\"tokens_per_s\":{graph_tokens_per_s:.1},\"eager_tokens_per_s\":{tokens_per_s:.1},\"logits_differing_from_eager\":{wrong},\"captures\":{},\"replays\":{},\"divergences\":{},\"staged_bytes_per_step\":{:.0},\"pass\":{ok}}}",
            stats.captures - before.0.captures,
            stats.replays - before.0.replays,
            stats.divergences - before.0.divergences,
            (staged - before.1) as f64 / steps as f64
        );
    }
    Ok(pass)
}
