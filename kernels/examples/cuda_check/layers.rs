//! The per-layer kernels against the CPU backend (norms, RoPE, gated
//! activations, elementwise steps) or an f64 reference (softmax, paged
//! attention over scattered KV blocks with the keys and values rounded to
//! F16 as the pool stores them). Tolerances are per operation, relative to
//! max(|expected|, 1).

use cudarc::driver::DevicePtr;
use switchyard_kernels::cpu::{CpuActivations, CpuBackend};
use switchyard_kernels::cuda::ops_layers::{self, AttentionBuffers, AttentionParams, Elementwise};
use switchyard_kernels::cuda::CudaDevice;
use switchyard_kernels::{Backend, RopeStyle};

use super::{random_values, Check};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Bitwise-identical operations (one IEEE operation per element) get 0.
const TOLERANCES: [(&str, f32); 11] = [
    ("rms_norm", 1e-5),
    ("rms_norm_heads", 1e-5),
    ("rope_interleaved", 1e-4),
    ("rope_neox", 1e-4),
    ("silu_mul", 1e-4),
    ("gelu_mul", 1e-4),
    ("add", 0.0),
    ("scale", 0.0),
    ("softcap", 1e-5),
    ("softmax", 1e-5),
    ("attention", 1e-4),
];

fn max_rel(expected: &[f32], got: &[f32]) -> f32 {
    if expected.len() != got.len() {
        return f32::INFINITY;
    }
    expected
        .iter()
        .zip(got)
        .map(|(e, g)| {
            if e.to_bits() == g.to_bits() {
                0.0
            } else {
                (e - g).abs() / e.abs().max(1.0)
            }
        })
        .fold(0.0, f32::max)
}

fn verdict(op: &str, detail: &str, err: f32) -> bool {
    let tol = TOLERANCES
        .iter()
        .find(|(n, _)| *n == op)
        .map_or(0.0, |(_, t)| *t);
    let pass = err <= tol;
    println!("{{\"check\":\"layer\",\"op\":\"{op}\",\"shape\":\"{detail}\",\"max_rel\":{err:e},\"tolerance\":{tol:e},\"pass\":{pass}}}");
    pass
}

pub fn layers(device: &CudaDevice) -> Check {
    let stream = device.stream();
    let cpu = CpuBackend::new(1);
    let mut rng = ChaCha8Rng::seed_from_u64(35);
    let mut ok = true;
    let rows_of = |a: &CpuActivations, rows: usize| -> Vec<f32> {
        (0..rows)
            .flat_map(|r| a.row(r).unwrap_or_default().to_vec())
            .collect()
    };

    let (rows, cols) = (4usize, 2048usize);
    let x = random_values(rows * cols, &mut rng, 3.0);
    let w = random_values(cols, &mut rng, 1.0);
    let mut y = cpu.activations(rows, cols);
    cpu.rms_norm(
        &CpuActivations::from_values(rows, cols, &x)?,
        &cpu.vector(&w)?,
        1e-6,
        &mut y,
    )?;
    let (x_d, w_d) = (stream.clone_htod(&x)?, stream.clone_htod(&w)?);
    let mut out = stream.alloc_zeros::<f32>(rows * cols)?;
    let (_table, w_ref) = ops_layers::table_of(stream, &w_d)?;
    ops_layers::rms_norm(device, &x_d, w_ref, 1e-6, &mut out, rows, cols)?;
    ok &= verdict(
        "rms_norm",
        "4x2048",
        max_rel(&rows_of(&y, rows), &stream.clone_dtoh(&out)?),
    );

    let (heads, hd) = (8usize, 128usize);
    let x = random_values(rows * heads * hd, &mut rng, 3.0);
    let w = random_values(hd, &mut rng, 1.0);
    let mut a = CpuActivations::from_values(rows, heads * hd, &x)?;
    cpu.rms_norm_heads(&mut a, &cpu.vector(&w)?, 1e-6)?;
    let mut x_d = stream.clone_htod(&x)?;
    let w_d = stream.clone_htod(&w)?;
    let (_table, w_ref) = ops_layers::table_of(stream, &w_d)?;
    ops_layers::rms_norm_heads(device, &mut x_d, w_ref, 1e-6, rows, heads, hd)?;
    ok &= verdict(
        "rms_norm_heads",
        "4x8x128",
        max_rel(&rows_of(&a, rows), &stream.clone_dtoh(&x_d)?),
    );

    let positions = [0u32, 7, 1000, 32000];
    let inv_freq: Vec<f32> = (0..hd / 2)
        .map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32))
        .collect();
    for (style, op) in [
        (RopeStyle::Interleaved, "rope_interleaved"),
        (RopeStyle::Neox, "rope_neox"),
    ] {
        let x = random_values(rows * heads * hd, &mut rng, 2.0);
        let mut a = CpuActivations::from_values(rows, heads * hd, &x)?;
        cpu.rope(&mut a, hd, &positions, &inv_freq, style)?;
        let mut x_d = stream.clone_htod(&x)?;
        let (p_d, f_d) = (
            stream.clone_htod(&positions)?,
            stream.clone_htod(&inv_freq)?,
        );
        let (p_a, f_a) = (p_d.device_ptr(stream).0, f_d.device_ptr(stream).0);
        ops_layers::rope(device, &mut x_d, heads * hd, hd, p_a, rows, f_a, style)?;
        ok &= verdict(
            op,
            "4x8x128",
            max_rel(&rows_of(&a, rows), &stream.clone_dtoh(&x_d)?),
        );
    }

    let n = 4096;
    let g = random_values(n, &mut rng, 8.0);
    let u = random_values(n, &mut rng, 2.0);
    let u_cpu = CpuActivations::from_values(1, n, &u)?;
    let u_d = stream.clone_htod(&u)?;
    for op in ["silu_mul", "gelu_mul", "add", "scale", "softcap"] {
        let mut a = CpuActivations::from_values(1, n, &g)?;
        let mut g_d = stream.clone_htod(&g)?;
        let step = match op {
            "silu_mul" => {
                cpu.silu_mul(&mut a, &u_cpu)?;
                Elementwise::SiluMul(&u_d)
            }
            "gelu_mul" => {
                cpu.gelu_mul(&mut a, &u_cpu)?;
                Elementwise::GeluMul(&u_d)
            }
            "add" => {
                cpu.add(&mut a, &u_cpu)?;
                Elementwise::Add(&u_d)
            }
            "scale" => {
                cpu.scale(&mut a, 45.25)?;
                Elementwise::Scale(45.25)
            }
            _ => {
                cpu.softcap(&mut a, 5.0)?;
                Elementwise::Softcap(5.0)
            }
        };
        ops_layers::elementwise(device, &mut g_d, step)?;
        ok &= verdict(
            op,
            "4096",
            max_rel(&rows_of(&a, 1), &stream.clone_dtoh(&g_d)?),
        );
    }

    let (rows, cols) = (3usize, 32000usize);
    let logits = random_values(rows * cols, &mut rng, 20.0);
    let mut expected = Vec::with_capacity(logits.len());
    for row in logits.chunks_exact(cols) {
        let m = row.iter().fold(f64::MIN, |m, v| m.max(f64::from(*v) / 0.7));
        let e: Vec<f64> = row
            .iter()
            .map(|v| (f64::from(*v) / 0.7 - m).exp())
            .collect();
        let s: f64 = e.iter().sum();
        expected.extend(e.iter().map(|v| (v / s) as f32));
    }
    let mut l_d = stream.clone_htod(&logits)?;
    ops_layers::softmax(device, &mut l_d, cols, 0.7)?;
    ok &= verdict(
        "softmax",
        "3x32000",
        max_rel(&expected, &stream.clone_dtoh(&l_d)?),
    );

    for (hd, window, softcap) in [(64, 0, 0.0), (128, 0, 0.0), (256, 0, 0.0), (128, 8, 30.0)] {
        ok &= attention(device, &mut rng, hd, window, softcap)?;
    }
    Ok(ok)
}

/// Two sequences in one call: 37 prompt rows of sequence 0 and 20 of
/// sequence 1, over blocks of 16 positions scattered in the pool; then one
/// decode row of sequence 1 at position 20.
fn attention(
    device: &CudaDevice,
    rng: &mut ChaCha8Rng,
    hd: usize,
    window: usize,
    softcap: f32,
) -> Check {
    let stream = device.stream();
    let (n_heads, n_kv, bp) = (8usize, 2usize, 16usize);
    let tables: [[i32; 3]; 2] = [[4, 1, 6], [0, 5, 2]];
    let pool_blocks = 7;
    let pool = stream.alloc_zeros::<u16>(pool_blocks * 2 * n_kv * bp * hd)?;
    let tables_d = stream.clone_htod(&tables.concat())?;
    let scale = 1.0 / (hd as f32).sqrt();
    let shape = AttentionParams {
        max_blocks: 3,
        n_heads: n_heads as i32,
        n_kv_heads: n_kv as i32,
        head_dim: hd as i32,
        block_positions: bp as i32,
        window: window as i32,
        scale,
        softcap,
        ..Default::default()
    };
    // Every position's key and value, per sequence, rounded as stored.
    let mut keys: Vec<Vec<f32>> = vec![Vec::new(), Vec::new()];
    let mut values: Vec<Vec<f32>> = vec![Vec::new(), Vec::new()];
    let mut worst = 0f32;
    for call in [vec![(0usize, 0..37usize), (1, 0..20)], vec![(1, 20..21)]] {
        let (mut seq, mut pos) = (Vec::new(), Vec::new());
        for (s, range) in &call {
            for p in range.clone() {
                seq.push(*s as i32);
                pos.push(p as i32);
            }
        }
        let rows = pos.len();
        let q = random_values(rows * n_heads * hd, rng, 1.0);
        let k = random_values(rows * n_kv * hd, rng, 1.0);
        let v = random_values(rows * n_kv * hd, rng, 1.0);
        for r in 0..rows {
            let s = seq[r] as usize;
            let f16 = |x: &f32| half::f16::from_f32(*x).to_f32();
            keys[s].extend(k[r * n_kv * hd..(r + 1) * n_kv * hd].iter().map(f16));
            values[s].extend(v[r * n_kv * hd..(r + 1) * n_kv * hd].iter().map(f16));
        }
        let (q_d, k_d, v_d) = (
            stream.clone_htod(&q)?,
            stream.clone_htod(&k)?,
            stream.clone_htod(&v)?,
        );
        let (seq_d, pos_d) = (stream.clone_htod(&seq)?, stream.clone_htod(&pos)?);
        let mut out = stream.alloc_zeros::<f32>(rows * n_heads * hd)?;
        ops_layers::attention(
            device,
            shape,
            AttentionBuffers {
                q: &q_d,
                k: &k_d,
                v: &v_d,
                pool: pool.device_ptr(stream).0,
                block_tables: tables_d.device_ptr(stream).0,
                row_seq: seq_d.device_ptr(stream).0,
                row_pos: pos_d.device_ptr(stream).0,
                rows,
                out: &mut out,
            },
        )?;
        let got = stream.clone_dtoh(&out)?;
        let mut expected = vec![0f32; got.len()];
        for r in 0..rows {
            let (s, p) = (seq[r] as usize, pos[r] as usize);
            let lo = if window > 0 {
                (p + 1).saturating_sub(window)
            } else {
                0
            };
            for h in 0..n_heads {
                let kvh = h / (n_heads / n_kv);
                let qh = &q[(r * n_heads + h) * hd..(r * n_heads + h + 1) * hd];
                let at = |t: usize| (t * n_kv + kvh) * hd;
                let scores: Vec<f64> = (lo..=p)
                    .map(|t| {
                        let dot: f64 = (0..hd)
                            .map(|d| f64::from(qh[d]) * f64::from(keys[s][at(t) + d]))
                            .sum();
                        let sc = dot * f64::from(scale);
                        if softcap > 0.0 {
                            f64::from(softcap) * (sc / f64::from(softcap)).tanh()
                        } else {
                            sc
                        }
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = scores.iter().map(|sc| (sc - m).exp()).collect();
                let total: f64 = w.iter().sum();
                for d in 0..hd {
                    let o: f64 = (lo..=p)
                        .zip(&w)
                        .map(|(t, w)| w * f64::from(values[s][at(t) + d]))
                        .sum();
                    expected[(r * n_heads + h) * hd + d] = (o / total) as f32;
                }
            }
        }
        worst = worst.max(max_rel(&expected, &got));
    }
    Ok(verdict(
        "attention",
        &format!("hd{hd} window{window} softcap{softcap}"),
        worst,
    ))
}
