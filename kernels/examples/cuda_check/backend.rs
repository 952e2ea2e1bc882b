//! `CudaBackend` against `CpuBackend` through the `Backend` trait alone, at
//! small shapes (so that it also runs under compute-sanitizer in
//! `--quick`): matmuls on the decode (MMVQ) and prefill (cuBLAS) paths per
//! tensor type, and attention over engine-style block tables (a
//! sliding-window ring, a block copied with `kv_copy`). The glue between
//! the trait and the kernels is what this checks; the kernels themselves
//! are checked bit for bit by `main.rs` and `layers.rs`.

use bytes::Bytes;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::cpu::CpuBackend;
use switchyard_kernels::cuda::{CudaBackend, CudaConfig};
use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::kv::{BlockTable, KvBlockShape, KvFormat};
use switchyard_kernels::{
    AttentionRows, AttentionShape, Backend, DType, KvLayout, KvType, WeightView,
};

use super::{random_values, Check};

/// Relative to the largest reference value: the CUDA prefill rounds rows
/// to F16 (2⁻¹¹) and both decode paths quantize rows to 8 bits per block
/// in their own order; a wrong block, row or table is off by O(1).
const MATMUL_TOL: f32 = 2e-2;
/// Keys and values are F16 on both; only summation order differs.
const ATTENTION_TOL: f32 = 1e-4;

fn rows_of<B: Backend>(
    b: &B,
    rows: usize,
    cols: usize,
    values: &[f32],
) -> Result<B::Activations, Box<dyn std::error::Error>> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let table = b.matrix(WeightView::new(DType::F32, rows, cols, Bytes::from(bytes))?)?;
    let mut out = b.activations(rows, cols);
    let tokens: Vec<u32> = (0..rows as u32).collect();
    b.embed(&table, &tokens, &mut out)?;
    Ok(out)
}

fn host<B: Backend>(b: &B, x: &B::Activations) -> Vec<f32> {
    let mut staging = Vec::new();
    b.host_rows(x, &mut staging).to_vec()
}

/// Largest |a - b| over the largest |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| {
        if x.is_finite() {
            m.max((x - y).abs())
        } else {
            f32::INFINITY
        }
    });
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    worst / scale
}

pub fn backend_against_cpu() -> Check {
    let gpu = CudaBackend::open(CudaConfig::default())?;
    let cpu = CpuBackend::new(2);
    let mut rng = ChaCha8Rng::seed_from_u64(35);
    let mut pass = true;
    let (rows, k) = (96usize, 256usize);
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_1,
        DType::Q4K,
        DType::Q6K,
    ] {
        let bytes = Bytes::from(quantize(dtype, &random_values(rows * k, &mut rng, 1.0))?);
        let w_gpu = gpu.matrix(WeightView::new(dtype, rows, k, bytes.clone())?)?;
        let w_cpu = cpu.matrix(WeightView::new(dtype, rows, k, bytes)?)?;
        let bias = random_values(rows, &mut rng, 1.0);
        let (b_gpu, b_cpu) = (gpu.vector(&bias)?, cpu.vector(&bias)?);
        // 1 and 7 rows: MMVQ; 40: dequantize to F16 and cuBLAS.
        for n in [1usize, 7, 40] {
            let x = random_values(n * k, &mut rng, 1.0);
            let (x_gpu, x_cpu) = (rows_of(&gpu, n, k, &x)?, rows_of(&cpu, n, k, &x)?);
            let (mut y_gpu, mut y_cpu) = (gpu.activations(n, rows), cpu.activations(n, rows));
            gpu.matmul(&x_gpu, &w_gpu, Some(&b_gpu), &mut y_gpu)?;
            cpu.matmul(&x_cpu, &w_cpu, Some(&b_cpu), &mut y_cpu)?;
            let err = rel_err(&host(&gpu, &y_gpu), &host(&cpu, &y_cpu));
            let ok = err <= MATMUL_TOL;
            pass &= ok;
            println!(
                "{{\"check\":\"backend_matmul\",\"dtype\":\"{dtype}\",\"rows\":{n},\"rel_err\":{err:.2e},\"tol\":{MATMUL_TOL:.0e},\"pass\":{ok}}}"
            );
        }
    }
    pass &= attention(&gpu, &cpu, &mut rng)?;
    Ok(pass)
}

/// One sequence, 2 layers (layer 1 a window of 40 in a ring), a 70-row
/// prompt then one decode row; then a second sequence whose first block
/// is a `kv_copy` of the first's, attending at position 64.
fn attention(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    rng: &mut ChaCha8Rng,
) -> Result<bool, Box<dyn std::error::Error>> {
    let (n_heads, n_kv, hd) = (4usize, 2usize, 64usize);
    let format = KvFormat::new(KvType::F16, 64);
    let layout = KvLayout::new(format, 2, n_kv, hd, 256, &[None, Some(40)])?;
    let shape = |layer: usize| AttentionShape {
        n_heads,
        n_kv_heads: n_kv,
        head_dim: hd,
        scale: 0.125,
        window: layout.window(layer),
        softcap: None,
    };
    let block = KvBlockShape {
        dtype: KvType::F16,
        n_kv_heads: n_kv,
        head_dim: hd,
        positions: layout.block_positions(),
    };
    fn tables<B: Backend>(
        b: &B,
        store: &mut B::KvStore,
        layout: &KvLayout,
        block: KvBlockShape,
    ) -> Result<BlockTable, Box<dyn std::error::Error>> {
        let mut t = BlockTable::new(layout.clone());
        for layer in 0..layout.layers() {
            for _ in 0..t.blocks_for(layer, layout.capacity()) {
                let id = b.kv_alloc(store, block)?;
                t.push(layer, id)?;
            }
        }
        Ok(t)
    }
    let mut gs = gpu.kv_store(format, 1 << 26)?;
    let mut cs = cpu.kv_store(format, 1 << 26)?;
    let (ta_g, ta_c) = (
        tables(gpu, &mut gs, &layout, block)?,
        tables(cpu, &mut cs, &layout, block)?,
    );
    let mut pass = true;
    let mut step = |name: &str,
                    tg: &BlockTable,
                    tc: &BlockTable,
                    gs: &mut _,
                    cs: &mut _,
                    start: usize,
                    n: usize|
     -> Result<(), Box<dyn std::error::Error>> {
        for layer in 0..2 {
            let q = random_values(n * n_heads * hd, rng, 1.0);
            let k = random_values(n * n_kv * hd, rng, 1.0);
            let v = random_values(n * n_kv * hd, rng, 1.0);
            let (qg, kg, vg) = (
                rows_of(gpu, n, n_heads * hd, &q)?,
                rows_of(gpu, n, n_kv * hd, &k)?,
                rows_of(gpu, n, n_kv * hd, &v)?,
            );
            let (qc, kc, vc) = (
                rows_of(cpu, n, n_heads * hd, &q)?,
                rows_of(cpu, n, n_kv * hd, &k)?,
                rows_of(cpu, n, n_kv * hd, &v)?,
            );
            let (mut og, mut oc) = (
                gpu.activations(n, n_heads * hd),
                cpu.activations(n, n_heads * hd),
            );
            let sg = [AttentionRows {
                table: tg,
                rows: 0..n,
                start_pos: start,
                prompt: n > 1,
            }];
            let sc = [AttentionRows {
                table: tc,
                rows: 0..n,
                start_pos: start,
                prompt: n > 1,
            }];
            gpu.attention(layer, shape(layer), &qg, &kg, &vg, gs, &sg, &mut og)?;
            cpu.attention(layer, shape(layer), &qc, &kc, &vc, cs, &sc, &mut oc)?;
            let err = rel_err(&host(gpu, &og), &host(cpu, &oc));
            let ok = err <= ATTENTION_TOL;
            pass &= ok;
            println!(
                "{{\"check\":\"backend_attention\",\"step\":\"{name}\",\"layer\":{layer},\"rows\":{n},\"rel_err\":{err:.2e},\"tol\":{ATTENTION_TOL:.0e},\"pass\":{ok}}}"
            );
        }
        Ok(())
    };
    step("prompt", &ta_g, &ta_c, &mut gs, &mut cs, 0, 70)?;
    step("decode", &ta_g, &ta_c, &mut gs, &mut cs, 70, 1)?;
    // A second sequence starting from a copy of the first's first block.
    let (tb_g, tb_c) = (
        tables(gpu, &mut gs, &layout, block)?,
        tables(cpu, &mut cs, &layout, block)?,
    );
    for layer in 0..2 {
        gpu.kv_copy(&mut gs, ta_g.layer(layer)[0], tb_g.layer(layer)[0], 64)?;
        cpu.kv_copy(&mut cs, ta_c.layer(layer)[0], tb_c.layer(layer)[0], 64)?;
    }
    step("after kv_copy", &tb_g, &tb_c, &mut gs, &mut cs, 64, 1)?;
    Ok(pass)
}
