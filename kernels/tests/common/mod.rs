//! Shared helpers for the kernel integration tests: random weight rows of
//! every type with realistic scales, and the activation-quantization
//! contract written out again, independently of the library.

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::{cpu::Isa, DType};

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// ISAs this machine runs, printed so a test log says what was covered.
pub fn isas_to_test(test: &str) -> Vec<Isa> {
    let isas = Isa::supported();
    let skipped: Vec<_> = Isa::ALL.iter().filter(|i| !isas.contains(i)).collect();
    println!("{test}: testing {isas:?}; skipped (not on this CPU): {skipped:?}");
    isas
}

fn f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// Random bytes for `rows` rows of `cols` elements of `dtype`. Scales are
/// small positive f16 values (as real checkpoints have), quants uniform
/// over their whole range, so every bit of every field is exercised.
pub fn random_weights(rng: &mut ChaCha8Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let blocks = rows * cols / dtype.block_len();
    let mut out = Vec::with_capacity(blocks * dtype.block_bytes());
    for _ in 0..blocks {
        let scale = rng.random_range(0.001f32..0.05);
        match dtype {
            DType::F32 => out.extend(rng.random_range(-1.0f32..1.0).to_le_bytes()),
            DType::F16 => out.extend(f16(rng.random_range(-1.0f32..1.0))),
            DType::BF16 => {
                let v = rng.random_range(-1.0f32..1.0);
                out.extend(((v.to_bits() >> 16) as u16).to_le_bytes());
            }
            DType::Q8_0 => {
                out.extend(f16(scale));
                out.extend((0..32).map(|_| rng.random::<u8>()));
            }
            DType::Q4_0 => {
                out.extend(f16(scale));
                out.extend((0..16).map(|_| rng.random::<u8>()));
            }
            DType::Q4_1 => {
                out.extend(f16(scale));
                out.extend(f16(-8.0 * scale * rng.random_range(0.5f32..1.5)));
                out.extend((0..16).map(|_| rng.random::<u8>()));
            }
            DType::Q5_0 => {
                out.extend(f16(scale / 2.0));
                out.extend((0..4 + 16).map(|_| rng.random::<u8>()));
            }
            DType::Q5_1 => {
                out.extend(f16(scale / 2.0));
                out.extend(f16(-8.0 * scale * rng.random_range(0.5f32..1.5)));
                out.extend((0..4 + 16).map(|_| rng.random::<u8>()));
            }
            DType::Q2K => {
                out.extend((0..16 + 64).map(|_| rng.random::<u8>()));
                out.extend(f16(scale / 8.0));
                out.extend(f16(scale / 16.0));
            }
            DType::Q3K => {
                out.extend((0..32 + 64 + 12).map(|_| rng.random::<u8>()));
                out.extend(f16(scale / 32.0));
            }
            DType::Q5K => {
                out.extend(f16(scale / 64.0));
                out.extend(f16(scale / 32.0));
                out.extend((0..12 + 32 + 128).map(|_| rng.random::<u8>()));
            }
            DType::IQ4NL => {
                out.extend(f16(scale / 64.0));
                out.extend((0..16).map(|_| rng.random::<u8>()));
            }
            DType::IQ4XS => {
                out.extend(f16(scale / 1024.0));
                out.extend((0..2 + 4 + 128).map(|_| rng.random::<u8>()));
            }
            DType::Q4K => {
                out.extend(f16(scale / 32.0));
                out.extend(f16(scale / 16.0));
                out.extend((0..12 + 128).map(|_| rng.random::<u8>()));
            }
            DType::Q6K => {
                out.extend((0..128 + 64 + 16).map(|_| rng.random::<u8>()));
                out.extend(f16(scale / 64.0));
            }
        }
    }
    out
}

/// Random activations: mostly ±2 with a few large outliers, as hidden
/// states have, plus an all-zero block to cover `d == 0`.
pub fn random_activations(rng: &mut ChaCha8Rng, n: usize, k: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * k)
        .map(|_| {
            if rng.random_range(0..50) == 0 {
                rng.random_range(-20.0f32..20.0)
            } else {
                rng.random_range(-2.0f32..2.0)
            }
        })
        .collect();
    if k >= 64 {
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
    }
    x
}

/// The contract: per 32 elements, `d = amax/127`, `q = round_ties_even(x/d)`
/// computed as `x · (1/d)` in f32; returns the dequantized activations
/// `d · q` as f64.
pub fn contract_quantize(x: &[f32]) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for block in x.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for v in block {
            let q = (v * id).round_ties_even() as i8;
            out.push(f64::from(d) * f64::from(q));
        }
    }
    out
}
