//! The CUDA kernels' block decoders, activation quantizer and per-block
//! dot products, compiled for the host and checked bit for bit against the
//! CPU backend for every tensor type.
//!
//! The harness (`kernels/cuda/test/host_harness.cu`) is built once per test
//! run by the CUDA toolkit's nvcc (`$SWITCHYARD_CUDA_ROOT`, else the folder
//! `scripts/install-cuda-toolchain.sh` installs to), else by the system's
//! C++ compiler from the same source; it says which. The CPU side is the
//! scalar ISA: the reference every SIMD kernel of the CPU equals.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cpu::{dequantize_row, CpuActivations, CpuBackend, Isa};
use crate::quantize::quantize;
use crate::{Backend, DType, WeightView};

fn toolkit_nvcc() -> Option<PathBuf> {
    let root = match std::env::var_os("SWITCHYARD_CUDA_ROOT") {
        Some(root) => PathBuf::from(root),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
            cache.join("switchyard/cuda-13.0/nvidia/cu13")
        }
    };
    let nvcc = root.join("bin/nvcc");
    nvcc.is_file().then_some(nvcc)
}

/// Builds the harness once; its path.
fn harness() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/test/host_harness.cu");
        let dir = Path::new(env!("OUT_DIR")).join("host-harness");
        std::fs::create_dir_all(&dir).expect("temp dir");
        let exe = dir.join("host_harness");
        // No FMA contraction: the CPU backend's Rust never contracts.
        let mut cmd = match toolkit_nvcc() {
            Some(nvcc) => {
                let lib = nvcc.parent().and_then(Path::parent).map(|r| r.join("lib"));
                let mut c = Command::new(nvcc);
                c.args(["-O2", "-Xcompiler", "-ffp-contract=off"]);
                if let Some(lib) = lib {
                    c.arg(format!("-L{}", lib.display()));
                }
                c
            }
            None => {
                let mut c = Command::new(std::env::var("CXX").unwrap_or_else(|_| "c++".into()));
                c.args(["-O2", "-ffp-contract=off", "-x", "c++"]);
                c
            }
        };
        cmd.arg("-o").arg(&exe).arg(&src);
        eprintln!("host harness: {cmd:?}");
        let out = cmd.output().expect("run the harness compiler");
        assert!(
            out.status.success(),
            "building the host harness failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    })
}

/// Sends one request, returns the reply of `reply_len` bytes.
fn ask(request: &[u8], reply_len: usize) -> Vec<u8> {
    let mut child = Command::new(harness())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the harness");
    let mut stdin = child.stdin.take().expect("stdin");
    let request = request.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&request));
    let out = child.wait_with_output().expect("harness output");
    writer.join().expect("writer").expect("write request");
    assert!(
        out.status.success(),
        "harness: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), reply_len, "harness reply length");
    out.stdout
}

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Byte ranges of a block that hold f16 scales: random bytes there could
/// be infinities or NaNs, which no checkpoint holds.
fn f16_fields(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4NL | DType::IQ4XS => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q6K => &[208],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::F32 | DType::F16 | DType::BF16 => &[],
    }
}

/// `n` elements of `dtype`: half quantized from random values (what a
/// quantizer writes), half random bytes with finite scales (every bit
/// pattern of quants, scales and mins).
fn random_blocks(dtype: DType, n: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    if !dtype.is_quantized() {
        return quantize(dtype, &values).expect("float quantize");
    }
    let mut bytes = quantize(dtype, &values).expect("quantize");
    let blocks = bytes.len() / dtype.block_bytes();
    for block in bytes.chunks_exact_mut(dtype.block_bytes()).skip(blocks / 2) {
        rng.fill(block);
        for &at in f16_fields(dtype) {
            let scale = half::f16::from_f32(rng.random_range(-0.05f32..0.05));
            block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
    }
    bytes
}

#[test]
fn block_decoders_equal_the_cpu_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    for dtype in DType::ALL {
        let n = 64 * 256;
        let bytes = random_blocks(dtype, n, &mut rng);
        let mut cpu = vec![0f32; n];
        dequantize_row(dtype, &bytes, &mut cpu).expect("cpu dequantize");
        let blocks = (n / dtype.block_len()) as u32;
        let mut req = words(&[1, dtype.ggml_id(), blocks]);
        req.extend_from_slice(&bytes);
        let cuda = f32s(&ask(&req, 4 * n));
        let diff = cpu
            .iter()
            .zip(&cuda)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            diff,
            None,
            "{dtype}: first differing element (cpu {cpu:?})",
            cpu = diff.map(|i| (cpu[i], cuda[i]))
        );
    }
}

#[test]
fn dot_products_equal_the_cpu_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let cpu = CpuBackend::with_isa(1, Isa::Scalar);
    let (rows, k) = (24usize, 1024usize);
    for dtype in DType::ALL {
        let w = random_blocks(dtype, rows * k, &mut rng);
        let mut x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0f32..3.0)).collect();
        // A zero block and a block of ties (x·id exactly half-way) too.
        x[..32].fill(0.0);
        for (i, v) in x[32..64].iter_mut().enumerate() {
            *v = if i == 0 { 127.0 } else { (i as f32) + 0.5 };
        }
        let matrix = cpu
            .matrix(WeightView::new(dtype, rows, k, w.clone().into()).expect("view"))
            .expect("matrix");
        let input = CpuActivations::from_values(1, k, &x).expect("activations");
        let mut y = cpu.activations(1, rows);
        cpu.matmul(&input, &matrix, None, &mut y)
            .expect("cpu matmul");
        let expected = y.row(0).expect("row").to_vec();

        let op = if dtype.is_quantized() { 2 } else { 3 };
        let mut req = words(&[op, dtype.ggml_id(), k as u32, rows as u32]);
        req.extend_from_slice(&w);
        req.extend(x.iter().flat_map(|v| v.to_le_bytes()));
        let extra = if dtype.is_quantized() {
            k + 4 * 2 * (k / 32)
        } else {
            0
        };
        let reply = ask(&req, extra + 4 * rows);
        let got = f32s(&reply[extra..]);
        for (row, (a, b)) in expected.iter().zip(&got).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{dtype} row {row}: cpu {a}, cuda {b}"
            );
        }
    }
}

#[test]
fn f16_narrowing_rounds_as_the_half_crate() {
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    let mut values: Vec<f32> = (0..20000)
        .map(|i| match i % 4 {
            0 => rng.random_range(-70000.0f32..70000.0),
            1 => rng.random_range(-1e-4f32..1e-4),
            2 => f32::from_bits(rng.random()),
            _ => rng.random_range(-1.0f32..1.0),
        })
        .filter(|v| !v.is_nan())
        .collect();
    // Ties at the f16 mantissa and subnormal boundaries.
    values.extend([
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        65520.0,
        65519.0,
        2.0f32.powi(-25),
        2.0f32.powi(-24) * 1.5,
    ]);
    let mut req = words(&[4, values.len() as u32]);
    req.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    let reply = ask(&req, 2 * values.len());
    for (v, h) in values.iter().zip(reply.chunks_exact(2)) {
        let got = u16::from_le_bytes([h[0], h[1]]);
        assert_eq!(got, half::f16::from_f32(*v).to_bits(), "{v:e}");
    }
}
