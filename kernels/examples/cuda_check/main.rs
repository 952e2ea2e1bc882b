//! The GPU check's Rust half (run by scripts/gpu-check.sh, which carries
//! this binary to a GPU machine): every kernel against the CPU backend as
//! the oracle, the pointer-table swap, decode bandwidth, a Llama-7B decode
//! step captured as a graph and replayed across 10,000 swaps, and the
//! backend's Llama-7B decode tokens/s at batch 1/16/64 (`decode7b.rs`). Writes one JSON object per line
//! to stdout (the script collects them into its report).
//!
//! Exit codes: 0 all checks passed, 1 a check failed, 3 no usable GPU (the
//! one-line reason on stderr: the dry run's stopping point).
//!
//! `cargo run --release -p switchyard-kernels --features cuda --example cuda_check [-- --quick]`
//!
//! Options: `--weights DIR` writes the Llama-7B run's logits to
//! `DIR/switchyard_logits.json` for `scripts/gpu_check_torch.py`. Two modes
//! need no GPU (`llama.rs`): `--export DIR [--tiny]` writes the Llama
//! checkpoint the decode runs use as a Hugging Face folder (F16
//! safetensors), and `--cpu-reference DIR` exports the tiny one and runs it
//! on the CPU backend, its logits beside it for
//! `scripts/gpu_check_reference.py`.

mod backend;
mod decode7b;
mod float_swaps;
mod graphs;
mod layers;
mod llama;
mod step_parts;
mod tiers;

use std::process::ExitCode;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaSlice;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_kernels::cpu::{CpuActivations, CpuBackend, Isa};
use switchyard_kernels::cuda::ops::{self, MatvecInput};
use switchyard_kernels::cuda::{
    self, Budgets, CudaDevice, CudaError, CudaMemory, DeviceMemory, PointerTable, Readiness,
    Residency, ResidentTable, SlotLayout, Tier, WeightImage,
};
use switchyard_kernels::formats::dequantize_row;
use switchyard_kernels::formats::quantize::quantize;
use switchyard_kernels::{Backend, DType, WeightView};

pub(crate) type Check = Result<bool, Box<dyn std::error::Error>>;

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// The value after `--name`, if given.
fn option(name: &str) -> Option<std::path::PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).map(Into::into)
}

/// `--export DIR [--tiny]` and `--cpu-reference DIR`: no GPU needed.
fn host_mode() -> Option<ExitCode> {
    let run = |result: Result<String, llama::Error>| match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cuda_check: {e}");
            ExitCode::FAILURE
        }
    };
    if let Some(dir) = option("--export") {
        let tiny = std::env::args().any(|a| a == "--tiny");
        let dims = if tiny { llama::TINY } else { llama::LLAMA_7B };
        let t = Instant::now();
        return Some(run(llama::Weights::generate(dims, llama::SEED)
            .export(&dir)
            .map(|bytes| {
                format!(
                    "{{\"check\":\"export\",\"dir\":{:?},\"bytes\":{bytes},\"seconds\":{:.1}}}",
                    dir.display().to_string(),
                    t.elapsed().as_secs_f64()
                )
            })));
    }
    if let Some(dir) = option("--cpu-reference") {
        return Some(run((|| -> Result<String, llama::Error> {
            let weights = llama::Weights::generate(llama::TINY, llama::SEED);
            weights.export(&dir)?;
            let cpu = CpuBackend::with_isa(1, Isa::Scalar);
            let model = llama::Model::upload(&cpu, &weights)?;
            let (tokens, rows) = model.reference_rows(&cpu)?;
            llama::write_logits(&dir, &tokens, &rows)?;
            Ok(format!(
                "{{\"check\":\"cpu_reference\",\"dir\":{:?}}}",
                dir.display().to_string()
            ))
        })()));
    }
    None
}

fn main() -> ExitCode {
    START.get_or_init(Instant::now);
    if let Some(code) = host_mode() {
        return code;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let weights_dir = option("--weights");
    let device = match cuda::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cuda_check: {e}");
            return ExitCode::from(3);
        }
    };
    println!(
        "{{\"check\":\"device\",\"device\":{:?}}}",
        device.describe()
    );
    let mut ok = true;
    let shapes: &[(usize, usize)] = if quick {
        &[(64, 512)]
    } else {
        &[(64, 512), (4096, 4096)]
    };
    for &(rows, k) in shapes {
        for dtype in DType::ALL {
            ok &= report(
                &format!("kernels {dtype} {rows}x{k}"),
                kernels_against_cpu(&device, dtype, rows, k),
            );
        }
    }
    ok &= report("layers", layers::layers(&device));
    ok &= report("backend against cpu", backend::backend_against_cpu());
    ok &= report(
        "serving graphs",
        graphs::graphs_against_eager(3, if quick { 12 } else { 40 }),
    );
    ok &= report(
        "f16 swaps over 32 rows",
        float_swaps::f16_swaps_over_32_rows(if quick { 12 } else { 200 }),
    );
    ok &= report("backend tiers", tiers::tiers_round_trip());
    ok &= report(
        "pointer-table swaps",
        swaps(&device, if quick { 200 } else { 10_000 }),
    );
    if !quick {
        ok &= report("decode bandwidth", bandwidth(&device));
        ok &= report("graph swaps", decode7b::graph_swaps(&device, 10_000));
        ok &= report(
            "backend decode",
            decode7b::backend_decode(&[1, 16, 64], 32, weights_dir.as_deref()),
        );
    }
    for m in cuda::sources::KernelModule::ALL {
        if let Some(origin) = device.module_origin(m) {
            println!(
                "{{\"check\":\"module\",\"module\":{:?},\"origin\":{origin:?}}}",
                m.name()
            );
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn report(name: &str, result: Check) -> bool {
    match result {
        Ok(pass) => {
            // Seconds since the start: where a GPU run's time goes.
            let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
            println!("{{\"check\":\"done\",\"name\":{name:?},\"pass\":{pass},\"t_s\":{t:.1}}}");
            pass
        }
        Err(e) => {
            println!(
                "{{\"check\":{name:?},\"pass\":false,\"error\":{:?}}}",
                e.to_string()
            );
            false
        }
    }
}

/// One matrix of `dtype` with its image uploaded alone.
struct Uploaded {
    table: PointerTable<u32, CudaMemory>,
    _weights: CudaSlice<u8>,
}

fn upload(
    mem: &CudaMemory,
    dtype: DType,
    rows: usize,
    k: usize,
    bytes: Vec<u8>,
) -> Result<Uploaded, CudaError> {
    let layout = SlotLayout::new(vec!["w".into()])?;
    let view = WeightView::new(dtype, rows, k, bytes.into())
        .map_err(|e| CudaError::Layout(e.to_string()))?;
    let image = WeightImage::pack(&layout, vec![("w", view)])?;
    let mut buf = mem.alloc(image.bytes.len())?;
    mem.write(&mut buf, 0, &image.bytes)?;
    let mut table = PointerTable::new(mem, 1)?;
    table.swap_to(mem, &0, &image.table_entries(mem.address(&buf)))?;
    Ok(Uploaded {
        table,
        _weights: buf,
    })
}

pub(crate) fn random_values(n: usize, rng: &mut ChaCha8Rng, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Decoders (bit for bit), F16 decoders (bit for bit) and the decode
/// matmul (within tolerance) against the CPU.
fn kernels_against_cpu(device: &CudaDevice, dtype: DType, rows: usize, k: usize) -> Check {
    let mut rng = ChaCha8Rng::seed_from_u64(34 + rows as u64);
    let stream = device.stream();
    let mem = CudaMemory::new(stream.clone());
    let bytes = quantize(dtype, &random_values(rows * k, &mut rng, 1.0))?;
    let w = upload(&mem, dtype, rows, k, bytes.clone())?;
    let table = w.table.address(&mem);

    let mut cpu_values = vec![0f32; rows * k];
    dequantize_row(dtype, &bytes, &mut cpu_values)?;
    let tokens: Vec<u32> = (0..rows as u32).collect();
    let tokens_d = stream.clone_htod(&tokens)?;
    let mut out = stream.alloc_zeros::<f32>(rows * k)?;
    let tokens_a = cudarc::driver::DevicePtr::device_ptr(&tokens_d, stream.as_ref()).0;
    ops::embed(device, table, 0, dtype, tokens_a, rows, &mut out, k)?;
    let gpu_values = stream.clone_dtoh(&out)?;
    let decode_mismatches = cpu_values
        .iter()
        .zip(&gpu_values)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();

    let mut halves = stream.alloc_zeros::<u16>(rows * k)?;
    ops::dequant_f16(device, table, 0, dtype, &mut halves, rows, k)?;
    let halves = stream.clone_dtoh(&halves)?;
    let f16_mismatches = cpu_values
        .iter()
        .zip(&halves)
        .filter(|(a, h)| half::f16::from_f32(**a).to_bits() != **h)
        .count();

    let cpu = CpuBackend::with_isa(1, Isa::Scalar);
    let matrix = cpu.matrix(WeightView::new(dtype, rows, k, bytes.into())?)?;
    let (mut max_abs, mut max_rel) = (0f32, 0f32);
    for n in [1usize, 4, 11] {
        let x = random_values(n * k, &mut rng, 2.0);
        let input = CpuActivations::from_values(n, k, &x)?;
        let mut y = cpu.activations(n, rows);
        cpu.matmul(&input, &matrix, None, &mut y)?;
        let x_d = stream.clone_htod(&x)?;
        let mut out = stream.alloc_zeros::<f32>(n * rows)?;
        if dtype.is_quantized() {
            let mut q = stream.alloc_zeros::<i8>(n * k)?;
            let mut ds = stream.alloc_zeros::<f32>(n * k / 16)?;
            ops::quantize_q8_1(device, &x_d, n, k, &mut q, &mut ds)?;
            ops::matvec(
                device,
                table,
                0,
                dtype,
                MatvecInput::Quantized { q: &q, ds: &ds },
                &mut out,
                rows,
                k,
                n,
                false,
            )?;
        } else {
            ops::matvec(
                device,
                table,
                0,
                dtype,
                MatvecInput::Float(&x_d),
                &mut out,
                rows,
                k,
                n,
                false,
            )?;
        }
        let got = stream.clone_dtoh(&out)?;
        for r in 0..n {
            let expected = y.row(r).ok_or("row")?;
            for (e, g) in expected.iter().zip(&got[r * rows..(r + 1) * rows]) {
                let abs = (e - g).abs();
                max_abs = max_abs.max(abs);
                max_rel = max_rel.max(abs / e.abs().max(1.0));
            }
        }
    }
    // Only the order of the f32 sums differs from the CPU's: relative to
    // max(|y|, 1) that is a few ulps of k terms.
    let tolerance = 1e-4 * (k as f32 / 512.0).max(1.0);
    let pass = decode_mismatches == 0 && f16_mismatches == 0 && max_rel <= tolerance;
    println!(
        "{{\"check\":\"kernels\",\"dtype\":\"{dtype}\",\"rows\":{rows},\"k\":{k},\"decode_mismatches\":{decode_mismatches},\"f16_mismatches\":{f16_mismatches},\"matvec_max_abs\":{max_abs:e},\"matvec_max_rel\":{max_rel:e},\"tolerance\":{tolerance:e},\"pass\":{pass}}}"
    );
    Ok(pass)
}

/// Two checkpoints of four Llama-7B-shaped Q4_K matrices made resident
/// through the residency tiers; the table swapped between them `swaps`
/// times, each swap followed by a decode matmul through the table whose
/// output must equal that checkpoint's.
fn swaps(device: &CudaDevice, swaps: usize) -> Check {
    let stream = device.stream();
    let mem = CudaMemory::new(stream.clone());
    let (rows, k, dtype) = (4096usize, 4096usize, DType::Q4K);
    let names: Vec<String> = ["q", "k", "v", "o"].iter().map(|s| s.to_string()).collect();
    let layout = SlotLayout::new(names.clone())?;
    let mut residency = Residency::new(
        mem.clone(),
        Budgets {
            device: 1 << 30,
            host: 1 << 30,
        },
    );
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut entries = Vec::new();
    for id in 0..2u32 {
        let tensors: Vec<(&str, WeightView)> = names
            .iter()
            .map(|n| {
                let bytes =
                    quantize(dtype, &random_values(rows * k, &mut rng, 1.0)).unwrap_or_default();
                (
                    n.as_str(),
                    WeightView::new(dtype, rows, k, bytes.into()).expect("view"),
                )
            })
            .collect();
        let image = WeightImage::pack(&layout, tensors)?;
        residency.insert_host(id, image)?;
        entries.push(
            residency.ensure_device(&id, &[], || Err(CudaError::Layout("not on disk".into())))?,
        );
    }
    let mut table = PointerTable::new(&mem, layout.len())?;
    let address = table.address(&mem);
    let x = random_values(k, &mut rng, 1.0);
    let x_d = stream.clone_htod(&x)?;
    let mut q = stream.alloc_zeros::<i8>(k)?;
    let mut ds = stream.alloc_zeros::<f32>(k / 16)?;
    ops::quantize_q8_1(device, &x_d, 1, k, &mut q, &mut ds)?;
    let mut out = stream.alloc_zeros::<f32>(rows)?;
    let mut expected = Vec::new();
    for (id, e) in entries.iter().enumerate() {
        table.swap_to(&mem, &(id as u32), e)?;
        ops::matvec(
            device,
            address,
            3,
            dtype,
            MatvecInput::Quantized { q: &q, ds: &ds },
            &mut out,
            rows,
            k,
            1,
            false,
        )?;
        expected.push(stream.clone_dtoh(&out)?);
    }
    if expected[0] == expected[1] {
        return Err("the two checkpoints give the same output".into());
    }
    let mut times = Vec::with_capacity(swaps);
    let mut wrong = 0usize;
    for i in 0..swaps {
        let id = i % 2;
        let t = Instant::now();
        table.swap_to(&mem, &(id as u32), &entries[id])?;
        stream.synchronize()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        ops::matvec(
            device,
            address,
            3,
            dtype,
            MatvecInput::Quantized { q: &q, ds: &ds },
            &mut out,
            rows,
            k,
            1,
            false,
        )?;
        if stream.clone_dtoh(&out)? != expected[id] {
            wrong += 1;
        }
    }
    times.sort_by(f64::total_cmp);
    let p = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    let pass = wrong == 0;
    println!(
        "{{\"check\":\"swaps\",\"swaps\":{swaps},\"wrong_outputs\":{wrong},\"swap_us_p50\":{:.1},\"swap_us_p99\":{:.1},\"pass\":{pass}}}",
        p(0.5),
        p(0.99)
    );
    let copy_up = copy_up_beside_a_batch(device, &mut residency, &expected, (&q, &ds), rows, k)?;
    Ok(pass && copy_up)
}

/// Checkpoint 1 moved down to pinned host memory, then up again on the
/// copy stream while decode matmuls of checkpoint 0 run on the main one:
/// its table swap is refused until the copy has landed, and after it the
/// output is checkpoint 1's. Reports the copy's time and rate.
fn copy_up_beside_a_batch(
    device: &CudaDevice,
    residency: &mut Residency<u32, CudaMemory>,
    expected: &[Vec<f32>],
    (q, ds): (&CudaSlice<i8>, &CudaSlice<f32>),
    rows: usize,
    k: usize,
) -> Check {
    let stream = device.stream();
    let mem = residency.memory().clone();
    let mut table: ResidentTable<u32, CudaMemory> = PointerTable::new(&mem, 4)?;
    let address = table.address(&mem);
    let not_on_disk = || Err(CudaError::Layout("not on disk".into()));
    residency.demote_to_host(&1, &[0])?;
    let host_tier = residency.tier(&1) == Tier::Host;
    residency.swap_to(&mut table, &0)?;
    let mut out = stream.alloc_zeros::<f32>(rows)?;
    let matvec = |out: &mut CudaSlice<f32>| {
        ops::matvec(
            device,
            address,
            3,
            DType::Q4K,
            MatvecInput::Quantized { q, ds },
            out,
            rows,
            k,
            1,
            false,
        )
    };
    let t = Instant::now();
    let started = residency.prefetch(&1, &[0], not_on_disk)?;
    let mut refused_while_copying = false;
    let mut batches = 0usize;
    while residency.ready(&1)?.is_none() {
        refused_while_copying |= residency.swap_to(&mut table, &1).is_err();
        matvec(&mut out)?;
        batches += 1;
    }
    let copy_ms = t.elapsed().as_secs_f64() * 1e3;
    stream.synchronize()?;
    let batch_right = stream.clone_dtoh(&out)? == expected[0] || batches == 0;
    residency.swap_to(&mut table, &1)?;
    matvec(&mut out)?;
    let swapped_right = stream.clone_dtoh(&out)? == expected[1];
    let pass = host_tier
        && started == Readiness::Copying
        && (refused_while_copying || batches == 0)
        && batch_right
        && swapped_right;
    let bytes = residency.device_used() / 2;
    println!(
        "{{\"check\":\"copy_up\",\"bytes\":{bytes},\"copy_ms\":{copy_ms:.2},\"gb_s\":{:.1},\"batches_beside\":{batches},\"refused_while_copying\":{refused_while_copying},\"pass\":{pass}}}",
        bytes as f64 / (copy_ms / 1e3) / 1e9
    );
    Ok(pass)
}

/// Decode matmul read rate (weight bytes per second, batch 1) against the
/// device-to-device copy rate (bytes read per second).
fn bandwidth(device: &CudaDevice) -> Check {
    let stream = device.stream();
    let ctx = device.context();
    let mem = CudaMemory::new(stream.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (rows, k) = (11008usize, 4096usize);
    let time = |f: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| -> Result<f64, Box<dyn std::error::Error>> {
        let (start, end) = (
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        );
        f()?;
        start.record(stream)?;
        for _ in 0..20 {
            f()?;
        }
        end.record(stream)?;
        end.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&end)?) / 20.0 / 1e3)
    };
    let src = stream.alloc_zeros::<u8>(rows * k * 2)?;
    let mut dst = stream.alloc_zeros::<u8>(rows * k * 2)?;
    let copy_s = time(&mut || Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    let copy_gbs = (rows * k * 2) as f64 / copy_s / 1e9;
    println!(
        "{{\"check\":\"copy\",\"bytes\":{},\"read_gb_s\":{copy_gbs:.1}}}",
        rows * k * 2
    );
    let x = random_values(k, &mut rng, 1.0);
    let x_d = stream.clone_htod(&x)?;
    let mut q = stream.alloc_zeros::<i8>(k)?;
    let mut ds = stream.alloc_zeros::<f32>(k / 16)?;
    ops::quantize_q8_1(device, &x_d, 1, k, &mut q, &mut ds)?;
    let mut out = stream.alloc_zeros::<f32>(rows)?;
    for dtype in [DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4K, DType::Q6K] {
        let bytes = quantize(dtype, &random_values(rows * k, &mut rng, 1.0))?;
        let n_bytes = bytes.len();
        let w = upload(&mem, dtype, rows, k, bytes)?;
        let table = w.table.address(&mem);
        let secs = time(&mut || {
            let input = if dtype.is_quantized() {
                MatvecInput::Quantized { q: &q, ds: &ds }
            } else {
                MatvecInput::Float(&x_d)
            };
            Ok(ops::matvec(
                device, table, 0, dtype, input, &mut out, rows, k, 1, false,
            )?)
        })?;
        let gbs = n_bytes as f64 / secs / 1e9;
        println!(
            "{{\"check\":\"decode_bandwidth\",\"dtype\":\"{dtype}\",\"rows\":{rows},\"k\":{k},\"us\":{:.1},\"weight_gb_s\":{gbs:.1},\"of_copy_rate\":{:.2}}}",
            secs * 1e6,
            gbs / copy_gbs
        );
    }
    Ok(true)
}
