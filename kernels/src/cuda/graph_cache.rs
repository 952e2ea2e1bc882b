//! Which captured decode step can be replayed: the bookkeeping of CUDA
//! graphs, apart from the driver so that it is tested on the host.
//!
//! A captured step holds the addresses its launches were given: the
//! weight pointer table, the activation and scratch buffers, the step's
//! inputs (tokens, positions, block tables). Replaying it is right exactly
//! when every one of those is still where it was and the step has the same
//! shape (rows, block-table width). What the addresses hold may change:
//! the inputs are rewritten before each replay, and swapping the
//! checkpoint rewrites the pointer table in place, so a swap never forces
//! a capture. A moved buffer (an activation resized, a table grown) does.

use std::collections::HashMap;

/// The shape a step was captured for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepShape {
    /// Activation rows (sequences in a decode step).
    pub rows: usize,
    /// Block ids per sequence in the attention tables.
    pub max_blocks: usize,
}

/// What to do for a step.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a, G> {
    /// Launch this graph.
    Replay(&'a G),
    /// Capture the step (none was, or its buffers moved: the stale graph
    /// is dropped) and [`GraphCache::insert`] it.
    Capture,
}

struct Entry<G> {
    addresses: Vec<u64>,
    graph: G,
}

/// Captured steps by shape, with counts for the GPU check's report.
pub struct GraphCache<G> {
    graphs: HashMap<StepShape, Entry<G>>,
    /// Shapes kept at most (a graph holds device memory for its nodes).
    limit: usize,
    pub captures: u64,
    pub replays: u64,
    /// Captures forced by moved buffers.
    pub invalidations: u64,
}

impl<G> GraphCache<G> {
    pub fn new(limit: usize) -> Self {
        GraphCache {
            graphs: HashMap::new(),
            limit: limit.max(1),
            captures: 0,
            replays: 0,
            invalidations: 0,
        }
    }

    /// The graph for `shape` if it was captured over `addresses`.
    pub fn lookup(&mut self, shape: StepShape, addresses: &[u64]) -> Lookup<'_, G> {
        let stale = match self.graphs.get(&shape) {
            Some(e) => e.addresses != addresses,
            None => return Lookup::Capture,
        };
        if stale {
            self.graphs.remove(&shape);
            self.invalidations += 1;
            return Lookup::Capture;
        }
        self.replays += 1;
        match self.graphs.get(&shape) {
            Some(e) => Lookup::Replay(&e.graph),
            None => Lookup::Capture,
        }
    }

    /// Keeps `graph`, captured for `shape` over `addresses`; past the
    /// limit another shape's graph is dropped first.
    pub fn insert(&mut self, shape: StepShape, addresses: Vec<u64>, graph: G) {
        if self.graphs.len() >= self.limit && !self.graphs.contains_key(&shape) {
            if let Some(old) = self.graphs.keys().next().copied() {
                self.graphs.remove(&old);
            }
        }
        self.captures += 1;
        self.graphs.insert(shape, Entry { addresses, graph });
    }

    pub fn len(&self) -> usize {
        self.graphs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.graphs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::{DeviceMemory, HostMemory};
    use super::super::pointer_table::PointerTable;
    use super::*;

    /// A captured "graph" on the host: launches recorded as (table, slot)
    /// and an output address, replayed by following the table as the
    /// kernels do at run time.
    #[derive(Debug, PartialEq)]
    struct HostGraph {
        table: u64,
        slots: Vec<u64>,
        out: u64,
    }

    impl HostGraph {
        /// Each launch: the first byte of its slot's weights, summed into `out`.
        fn replay(&self, mem: &HostMemory) -> u8 {
            let mut sum = 0u8;
            for slot in &self.slots {
                let entry = mem.read_at(self.table + 8 * slot, 8).unwrap();
                let w = u64::from_le_bytes(entry.try_into().unwrap());
                sum = sum.wrapping_add(mem.read_at(w, 1).unwrap()[0]);
            }
            mem.write_at(self.out, &[sum]).unwrap();
            sum
        }
    }

    #[test]
    fn swaps_replay_the_same_graph_and_moved_buffers_recapture() {
        let mem = HostMemory::new(1 << 20);
        // Two checkpoints of two matrices each: bytes 1, 2 and 10, 20.
        let mut weights = Vec::new();
        let mut entries = Vec::new();
        for fills in [[1u8, 2], [10, 20]] {
            let mut addrs = Vec::new();
            for f in fills {
                let mut b = mem.alloc(64).unwrap();
                mem.write(&mut b, 0, &[f; 64]).unwrap();
                addrs.push(mem.address(&b));
                weights.push(b);
            }
            entries.push(addrs);
        }
        let mut table = PointerTable::<usize, _>::new(&mem, 2).unwrap();
        let mut out = mem.alloc(4).unwrap();
        let shape = StepShape {
            rows: 1,
            max_blocks: 4,
        };
        let mut cache = GraphCache::<HostGraph>::new(4);
        let captured = |table: &PointerTable<usize, HostMemory>, out: &_| {
            let addresses = vec![table.address(&mem), mem.address(out)];
            let graph = HostGraph {
                table: addresses[0],
                slots: vec![0, 1],
                out: addresses[1],
            };
            (addresses, graph)
        };
        for step in 0..6 {
            let id = step % 2;
            table.swap_to(&mem, &id, &entries[id]).unwrap();
            let (addresses, graph) = captured(&table, &out);
            let sum = match cache.lookup(shape, &addresses) {
                Lookup::Replay(g) => g.replay(&mem),
                Lookup::Capture => {
                    let sum = graph.replay(&mem);
                    cache.insert(shape, addresses, graph);
                    sum
                }
            };
            assert_eq!(sum, if id == 0 { 3 } else { 30 }, "step {step}");
            assert_eq!(mem.read_at(mem.address(&out), 1), Some(vec![sum]));
        }
        assert_eq!(
            (cache.captures, cache.replays, cache.invalidations),
            (1, 5, 0)
        );

        // The output buffer moves (an activation reallocated): recapture.
        out = mem.alloc(4).unwrap();
        let (addresses, graph) = captured(&table, &out);
        assert_eq!(cache.lookup(shape, &addresses), Lookup::Capture);
        assert_eq!(cache.invalidations, 1);
        assert!(cache.is_empty());
        cache.insert(shape, addresses.clone(), graph);
        assert!(matches!(cache.lookup(shape, &addresses), Lookup::Replay(_)));
        // Another batch size is another graph, kept beside it up to the limit.
        let wide = StepShape {
            rows: 16,
            max_blocks: 4,
        };
        assert_eq!(cache.lookup(wide, &addresses), Lookup::Capture);
        for rows in 2..8 {
            let (a, g) = captured(&table, &out);
            cache.insert(
                StepShape {
                    rows,
                    max_blocks: 4,
                },
                a,
                g,
            );
        }
        assert_eq!(cache.len(), 4);
    }
}
