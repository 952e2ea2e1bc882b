//! A product of 40 rows against F32 weights under one captured step, the
//! weights swapped between two checkpoints, on the host stand-in: the
//! GEMM is recorded with its pointer arrays and reads them when it runs,
//! as `cublasGemmBatchedEx` does.

use super::*;
use crate::cuda::memory::{DeviceMemory, HostMemory};
use crate::cuda::step_graph::{Finish, GraphStats, Launch, Mode, StepGraphs};
use crate::StepKey;

/// The backend's `kind::WEIGHTS` and `kind::GEMM_OPERANDS`.
const WEIGHTS: u8 = 6;
const GEMM_OPERANDS: u8 = 7;
const N: usize = 40;
const K: usize = 8;
const ROWS: usize = 4;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("chunks_exact gives four bytes")))
        .collect()
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn pointer(mem: &HostMemory, at: u64) -> u64 {
    let read = mem
        .read_at(at, 8)
        .expect("a pointer slot lies in host memory");
    u64::from_le_bytes(read.try_into().expect("read_at(_, 8) gives eight bytes"))
}

/// The batched GEMM: `C = B · Aᵀ` (N × ROWS), every matrix found through
/// its pointer array at run time.
fn gemm(mem: &HostMemory, arrays: GemmArrays) {
    let w = f32s(
        &mem.read_at(pointer(mem, arrays.a), ROWS * K * 4)
            .expect("the weight the table names is in host memory"),
    );
    let x = f32s(
        &mem.read_at(pointer(mem, arrays.b), N * K * 4)
            .expect("the staged input is in host memory"),
    );
    let out: Vec<f32> = (0..N)
        .flat_map(|i| {
            let (w, x) = (&w, &x);
            (0..ROWS).map(move |r| (0..K).map(|j| x[i * K + j] * w[r * K + j]).sum())
        })
        .collect();
    mem.write_at(pointer(mem, arrays.c), &bytes(&out))
        .expect("the staged output is in host memory");
}

struct Device {
    mem: HostMemory,
    arena: <HostMemory as DeviceMemory>::Buffer,
    recording: Vec<GemmArrays>,
}

impl Device {
    fn upload(&mut self, g: &mut StepGraphs<Vec<GemmArrays>>) {
        for r in g.arena.take_dirty() {
            let bytes = g.arena.image()[r.clone()].to_vec();
            self.mem
                .write(&mut self.arena, r.start, &bytes)
                .expect("the arena holds the staged pointer arrays");
        }
    }
}

/// One keyed step of a product over the weight at `weight`; the
/// signature names what the backend's does (`products.rs`): the rows,
/// the output, the weight's table place, never the weight's address
/// unless `by_address` (what `cublasGemmEx` needed).
fn step(
    g: &mut StepGraphs<Vec<GemmArrays>>,
    d: &mut Device,
    (x, out): (u64, u64),
    weight: u64,
    by_address: bool,
) -> Result<(), crate::cuda::step_arena::StageError> {
    g.begin(Some(StepKey(1)), true);
    let arena = d.mem.address(&d.arena);
    let table = g.stage(&weight.to_le_bytes(), WEIGHTS)?;
    let staged = g.stage(&operand_bytes(x, out), GEMM_OPERANDS)?;
    let arrays = arrays(arena + table as u64, 0, arena + staged as u64);
    let mut sig = vec![9, x, N as u64, K as u64, arena + table as u64, 0, out];
    if by_address {
        sig.push(weight);
    }
    match (g.enter(&sig)?, g.mode()) {
        (Launch::Run, Mode::Eager) => {
            d.upload(g);
            gemm(&d.mem, arrays);
        }
        (Launch::Run, Mode::Capture) => d.recording.push(arrays),
        (Launch::Skip, _) => {}
        other => panic!("{other:?}"),
    }
    match g.finish()? {
        Finish::Nothing => {}
        Finish::EndCapture | Finish::Replay => {
            if g.mode() == Mode::Capture {
                g.keep(std::mem::take(&mut d.recording));
            }
            d.upload(g);
            for arrays in g.graph().expect("a recorded step has its graph").clone() {
                gemm(&d.mem, arrays);
            }
        }
    }
    Ok(())
}

#[test]
fn a_replayed_gemm_reads_the_swapped_weight_through_its_pointer_array() {
    let mem = HostMemory::new(1 << 20);
    let xs: Vec<f32> = (0..N * K).map(|i| (i % 7) as f32 - 3.0).collect();
    let mut x = mem
        .alloc(N * K * 4)
        .expect("the staged input is in host memory");
    mem.write(&mut x, 0, &bytes(&xs))
        .expect("the input fits host memory");
    let out = mem
        .alloc(N * ROWS * 4)
        .expect("the output fits host memory");
    let mut weights = Vec::new();
    let mut addresses = Vec::new();
    for c in 0..2 {
        let w: Vec<f32> = (0..ROWS * K).map(|i| (i + 3 * c) as f32 * 0.5).collect();
        let mut buf = mem.alloc(w.len() * 4).expect("a weight fits host memory");
        mem.write(&mut buf, 0, &bytes(&w))
            .expect("the weight's buffer holds it");
        addresses.push(mem.address(&buf));
        weights.push((buf, w));
    }
    let expected = |c: usize| -> Vec<f32> {
        let w = &weights[c].1;
        (0..N)
            .flat_map(|i| {
                let xs = &xs;
                (0..ROWS).map(move |r| (0..K).map(|j| xs[i * K + j] * w[r * K + j]).sum())
            })
            .collect()
    };
    let io = (mem.address(&x), mem.address(&out));
    let mut d = Device {
        arena: mem.alloc(4096).expect("the arena fits host memory"),
        mem,
        recording: Vec::new(),
    };
    let mut g = StepGraphs::new(4, 4096);
    for i in 0..10 {
        let c = i % 2;
        step(&mut g, &mut d, io, addresses[c], false)
            .expect("a step through the batched GEMM runs");
        let got = f32s(
            &d.mem
                .read_at(io.1, N * ROWS * 4)
                .expect("the output is in host memory"),
        );
        assert_eq!(got, expected(c), "step {i}, checkpoint {c}");
    }
    // One capture, replays for both checkpoints: the swap is the staged
    // address, not a new graph.
    assert_eq!(
        g.stats,
        GraphStats {
            eager_steps: 1,
            captures: 1,
            replays: 8,
            divergences: 0
        }
    );

    // What `cublasGemmEx` forced: the weight's address in the signature,
    // so the first swap after the capture diverges.
    let mut g = StepGraphs::new(4, 4096);
    step(&mut g, &mut d, io, addresses[0], true).expect("a step through the batched GEMM runs");
    step(&mut g, &mut d, io, addresses[0], true).expect("a step through the batched GEMM runs");
    assert!(step(&mut g, &mut d, io, addresses[1], true).is_err());
}

#[test]
fn the_arrays_point_at_the_table_entry_and_the_staged_operands() {
    let a = arrays(0x1000, 3, 0x2000);
    assert_eq!(a.a, 0x1000 + 24);
    assert_eq!((a.b, a.c), (0x2000, 0x2008));
    let staged = operand_bytes(0xAB, 0xCD);
    assert_eq!(
        u64::from_le_bytes(staged[..8].try_into().expect("a pointer is eight bytes")),
        0xAB
    );
    assert_eq!(
        u64::from_le_bytes(staged[8..].try_into().expect("a pointer is eight bytes")),
        0xCD
    );
}
