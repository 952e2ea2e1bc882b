//! Checkpoint swaps under one captured step, on the host stand-in: the
//! bookkeeping the CUDA backend runs (`backend/weight_refs.rs`). In a
//! keyed step every launch names its weights by a small table of addresses
//! staged in the step arena, never by a checkpoint's own slot, so the
//! graph captured for one checkpoint replays for another of the same
//! shapes; what a swap costs is the changed addresses, copied before the
//! launch.

use super::memory::{DeviceMemory, HostMemory};
use super::step_graph::{Finish, GraphStats, Launch, Mode, StepGraphs};
use crate::StepKey;

/// Staged weight addresses (the backend's `kind::WEIGHTS`).
const WEIGHTS: u8 = 6;

/// A recorded "kernel": reads the address at `table` in the arena, then
/// sums `len` bytes of the weight there (as a kernel reading
/// `sy_weight(table, 0)` does).
#[derive(Clone, Debug)]
struct Op {
    table: usize,
    len: usize,
}

struct Device {
    mem: HostMemory,
    arena: <HostMemory as DeviceMemory>::Buffer,
    out: Vec<u64>,
    recording: Vec<Op>,
}

impl Device {
    fn run(&mut self, op: &Op) {
        let at = self.mem.address(&self.arena) + op.table as u64;
        let entry = self
            .mem
            .read_at(at, 8)
            .expect("the table entry lies inside the arena");
        let weight = u64::from_le_bytes(entry.try_into().expect("a table entry is 8 bytes"));
        let bytes = self
            .mem
            .read_at(weight, op.len)
            .expect("the staged address is a live weight buffer");
        self.out.push(bytes.iter().map(|b| u64::from(*b)).sum());
    }

    fn upload(&mut self, g: &mut StepGraphs<Vec<Op>>) {
        for r in g.arena.take_dirty() {
            let bytes = g.arena.image()[r.clone()].to_vec();
            self.mem
                .write(&mut self.arena, r.start, &bytes)
                .expect("a dirty range lies inside the arena");
        }
    }
}

/// One decode step of a checkpoint whose layers' weights lie at
/// `weights`: per layer, stage the weight's address, launch over it.
fn step(g: &mut StepGraphs<Vec<Op>>, d: &mut Device, key: StepKey, weights: &[u64]) -> Vec<u64> {
    g.begin(Some(key), true);
    d.out.clear();
    d.recording.clear();
    for w in weights {
        let table = g
            .stage(&w.to_le_bytes(), WEIGHTS)
            .expect("the arena has room for every layer's entry");
        let op = Op { table, len: 16 };
        // The signature names the arena place, never the weight.
        match (
            g.enter(&[3, table as u64, 16])
                .expect("each launch enters the step begun above"),
            g.mode(),
        ) {
            (Launch::Run, Mode::Eager) => {
                d.upload(g);
                d.run(&op);
            }
            (Launch::Run, Mode::Capture) => d.recording.push(op),
            (Launch::Skip, _) => {}
            other => panic!("{other:?}"),
        }
    }
    match g.finish().expect("the step begun above finishes") {
        Finish::Nothing => {}
        Finish::EndCapture | Finish::Replay => {
            if g.mode() == Mode::Capture {
                g.keep(std::mem::take(&mut d.recording));
            }
            d.upload(g);
            for op in g
                .graph()
                .expect("a captured or replayed step has its graph")
                .clone()
            {
                d.run(&op);
            }
        }
    }
    d.out.clone()
}

#[test]
fn two_checkpoints_replay_one_captured_step_and_a_swap_copies_their_addresses() {
    let mem = HostMemory::new(1 << 20);
    let layers = 4;
    // Two checkpoints of one shape: layer l of checkpoint c filled with
    // 10·c + l + 1.
    let mut bufs = Vec::new();
    let mut checkpoints: Vec<Vec<u64>> = Vec::new();
    for c in 0..2u8 {
        let mut addresses = Vec::new();
        for l in 0..layers as u8 {
            let mut buf = mem
                .alloc(16)
                .expect("1 MiB of host memory holds every weight");
            mem.write(&mut buf, 0, &[10 * c + l + 1; 16])
                .expect("16 bytes fit the 16-byte buffer");
            addresses.push(mem.address(&buf));
            bufs.push(buf);
        }
        checkpoints.push(addresses);
    }
    let expected =
        |c: u64| -> Vec<u64> { (0..layers as u64).map(|l| 16 * (10 * c + l + 1)).collect() };
    let mut d = Device {
        arena: mem
            .alloc(4096)
            .expect("1 MiB of host memory holds the arena"),
        mem,
        out: Vec::new(),
        recording: Vec::new(),
    };
    let mut g = StepGraphs::new(4, 4096);
    let key = StepKey(9);
    let mut swap_bytes = Vec::new();
    for i in 0..10u64 {
        let c = i % 2;
        let before = g.arena.copied_bytes;
        let out = step(&mut g, &mut d, key, &checkpoints[c as usize]);
        assert_eq!(out, expected(c), "step {i} on checkpoint {c}");
        swap_bytes.push(g.arena.copied_bytes - before);
    }
    // One capture (the key's second step), replays after it, whichever
    // checkpoint the step runs: no divergence, no second graph.
    assert_eq!(
        g.stats,
        GraphStats {
            eager_steps: 1,
            captures: 1,
            replays: 8,
            divergences: 0
        }
    );
    assert_eq!(g.len(), 1);
    // Each swap copied the layers' new addresses: 8 bytes each.
    assert!(
        swap_bytes[2..].iter().all(|b| *b == 8 * layers as u64),
        "{swap_bytes:?}"
    );
    // The last step ran checkpoint 1: running it again copies nothing.
    let before = g.arena.copied_bytes;
    assert_eq!(step(&mut g, &mut d, key, &checkpoints[1]), expected(1));
    assert_eq!(g.arena.copied_bytes - before, 0);
}
