//! The backend's residency tiers through the `Backend` trait: a Q4_K
//! matrix of Llama-7B's FFN shape demoted to pinned host memory (a matmul
//! on it is then refused, not run on freed memory), prefetched on the copy
//! stream while matmuls on another matrix run, and used once its copy
//! landed: its output equal bit for bit to the one before the round trip.

use std::time::Instant;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::cuda::{CudaBackend, CudaConfig};
use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::{Backend, DType, MatmulInput, MatmulProduct, WeightTier, WeightView};

use super::{random_values, Check};

const ROWS: usize = 11008;
const K: usize = 4096;

fn product<B: Backend>(
    b: &B,
    w: &B::Matrix,
    x: &B::Activations,
    out: &mut B::Activations,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    b.matmul_many(
        MatmulInput::Rows(x),
        &mut [MatmulProduct {
            w,
            bias: None,
            out,
            accumulate: false,
        }],
    )?;
    let mut staging = Vec::new();
    Ok(b.host_rows(out, &mut staging).to_vec())
}

pub fn tiers_round_trip() -> Check {
    let gpu = CudaBackend::open(CudaConfig::default())?;
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    let mut matrix = || -> Result<_, Box<dyn std::error::Error>> {
        let bytes = quantize(DType::Q4K, &random_values(ROWS * K, &mut rng, 0.1))?;
        Ok(gpu.matrix(WeightView::new(DType::Q4K, ROWS, K, bytes.into())?)?)
    };
    let (moved, busy) = (matrix()?, matrix()?);
    // A row of random values (an embedding lookup), not zeros: the output
    // must say something about the weights.
    let table = {
        let values = random_values(4 * K, &mut ChaCha8Rng::seed_from_u64(35), 1.0);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        gpu.matrix(WeightView::new(DType::F32, 4, K, bytes.into())?)?
    };
    let mut x = gpu.activations(1, K);
    gpu.embed(&table, &[1], &mut x)?;
    let mut out = gpu.activations(1, ROWS);
    let before = product(&gpu, &moved, &x, &mut out)?;

    let demoted = gpu.demote(&[&moved])?;
    let tier_down = gpu.weight_tier(&[&moved]);
    let refused = product(&gpu, &moved, &x, &mut out).is_err();
    let host_bytes = gpu.host_tier_bytes();
    let t0 = Instant::now();
    let started = gpu.prefetch(&[&moved])?;
    // Matmuls on the other matrix while the copy runs.
    let mut beside = 0;
    while gpu.weight_tier(&[&moved]) != WeightTier::Resident {
        product(&gpu, &busy, &x, &mut out)?;
        beside += 1;
        if t0.elapsed().as_secs() > 10 {
            return Err("the copy up did not land within 10 s".into());
        }
    }
    let landed_ms = t0.elapsed().as_secs_f64() * 1e3;
    let after = product(&gpu, &moved, &x, &mut out)?;
    let pass = demoted
        && tier_down == WeightTier::Host
        && refused
        && host_bytes > 0
        && gpu.host_tier_bytes() == 0
        && after == before
        && before.iter().any(|v| *v != 0.0);
    println!(
        "{{\"check\":\"backend_tiers\",\"bytes\":{host_bytes},\"demoted\":{demoted},\"tier_after_demote\":\"{tier_down:?}\",\"matmul_refused_while_host\":{refused},\"prefetch_returned\":\"{started:?}\",\"matmuls_beside_copy\":{beside},\"landed_ms\":{landed_ms:.2},\"equal_after_round_trip\":{},\"pass\":{pass}}}",
        after == before
    );
    Ok(pass)
}
