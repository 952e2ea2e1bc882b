//! CUDA graphs in the serving path: which step is launched op by op,
//! which is captured, and which replays a captured graph, apart from the
//! driver so that it is tested on the host.
//!
//! The engine opens each step with a [`StepKey`] (or none): equal keys
//! promise the same calls with the same shapes. A key seen once more is
//! captured; from then on its steps replay. The promise is checked, not
//! trusted: every launching call of a step gives its *signature* (the
//! operation, every device address and scalar its launch is given), and a
//! replaying step compares each with the captured one before anything is
//! launched. The step's small inputs go to fixed places of the
//! [`StepArena`], so a replay's kernels read this step's tokens, positions
//! and tables where the capture's read its own. If a signature or a
//! segment differs (an activation reallocated, a block table outgrew its
//! bucket), nothing was launched yet: the step is reported diverged, the
//! engine runs it again eagerly, and the key's graph is dropped; a key
//! that diverges again and again is no longer captured.

use std::collections::{HashMap, HashSet};

use super::step_arena::{Segment, StageError, StepArena};
use crate::StepKey;

/// Divergences after which a key is only run eagerly.
pub const REFUSE_AFTER: u32 = 3;

/// How the current step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Each call launches.
    Eager,
    /// Each call's launches are recorded into a graph (the stream is
    /// capturing), launched at the step's end.
    Capture,
    /// Calls launch nothing; the captured graph runs at the step's end.
    Replay,
}

/// What a call does with its launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    Run,
    Skip,
}

/// What the step's end must do.
#[derive(Debug, PartialEq, Eq)]
pub enum Finish {
    /// Nothing: every call launched.
    Nothing,
    /// End the capture, keep the graph with [`StepGraphs::keep`], copy the
    /// arena's dirty ranges, launch it.
    EndCapture,
    /// Copy the arena's dirty ranges, launch the key's graph.
    Replay,
}

struct Captured<G> {
    graph: G,
    signatures: Vec<u64>,
    segments: Vec<Segment>,
}

/// Counts for logs and the GPU check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub eager_steps: u64,
    pub captures: u64,
    pub replays: u64,
    pub divergences: u64,
}

/// The state; see the module documentation.
pub struct StepGraphs<G> {
    graphs: HashMap<StepKey, Captured<G>>,
    /// Keys seen once (capture comes at the second sighting: a one-off
    /// shape costs no capture).
    seen: HashSet<StepKey>,
    diverged: HashMap<StepKey, u32>,
    /// Graphs kept at most (each holds device memory for its nodes).
    limit: usize,
    mode: Mode,
    key: Option<StepKey>,
    /// This step's signatures so far, each `[len, words...]`.
    signatures: Vec<u64>,
    cursor: usize,
    pub arena: StepArena,
    pub stats: GraphStats,
}

fn diverged(detail: impl Into<String>) -> StageError {
    StageError::Diverged(detail.into())
}

impl<G> StepGraphs<G> {
    pub fn new(limit: usize, arena_bytes: usize) -> Self {
        StepGraphs {
            graphs: HashMap::new(),
            seen: HashSet::new(),
            diverged: HashMap::new(),
            limit: limit.max(1),
            mode: Mode::Eager,
            key: None,
            signatures: Vec::new(),
            cursor: 0,
            arena: StepArena::new(arena_bytes),
            stats: GraphStats::default(),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Opens a step of `key` (none: eager); `capturable` is the backend's
    /// own say (a step it cannot capture, such as one through cuBLAS).
    pub fn begin(&mut self, key: Option<StepKey>, capturable: bool) -> Mode {
        self.arena.begin();
        self.signatures.clear();
        self.cursor = 0;
        self.key = key;
        let refused = |k: &StepKey| self.diverged.get(k).is_some_and(|n| *n >= REFUSE_AFTER);
        self.mode = match key {
            Some(k) if capturable && !refused(&k) => {
                if self.graphs.contains_key(&k) {
                    Mode::Replay
                } else if self.seen.contains(&k) {
                    Mode::Capture
                } else {
                    if self.seen.len() >= 64 * self.limit {
                        self.seen.clear(); // bounded: forgetting costs a late capture
                    }
                    self.seen.insert(k);
                    Mode::Eager
                }
            }
            _ => Mode::Eager,
        };
        if self.mode == Mode::Eager {
            self.stats.eager_steps += 1;
        }
        self.mode
    }

    /// A launching call of `signature`: run its launches, or skip them
    /// (replay), or the step diverged.
    pub fn enter(&mut self, signature: &[u64]) -> Result<Launch, StageError> {
        match self.mode {
            Mode::Eager => Ok(Launch::Run),
            Mode::Capture => {
                self.signatures.push(signature.len() as u64);
                self.signatures.extend_from_slice(signature);
                Ok(Launch::Run)
            }
            Mode::Replay => {
                let captured = self.captured()?;
                let end = self.cursor + 1 + signature.len();
                let ours = captured.signatures.get(self.cursor..end);
                let expected = [&[signature.len() as u64][..], signature].concat();
                if ours != Some(&expected[..]) {
                    return Err(diverged(format!(
                        "call at word {} differs from the capture ({:?})",
                        self.cursor,
                        signature.first()
                    )));
                }
                self.cursor = end;
                Ok(Launch::Skip)
            }
        }
    }

    fn captured(&self) -> Result<&Captured<G>, StageError> {
        self.key
            .and_then(|k| self.graphs.get(&k))
            .ok_or_else(|| diverged("no graph for the step's key"))
    }

    /// Stages a step input (see [`StepArena::stage`]), following the
    /// captured layout in a replay.
    pub fn stage(&mut self, bytes: &[u8], kind: u8) -> Result<usize, StageError> {
        let layout = match self.mode {
            Mode::Replay => Some(
                self.key
                    .and_then(|k| self.graphs.get(&k))
                    .map(|c| c.segments.as_slice())
                    .ok_or_else(|| diverged("no graph for the step's key"))?,
            ),
            _ => None,
        };
        self.arena.stage(bytes, kind, layout)
    }

    /// The step ends (its results are about to be read).
    pub fn finish(&mut self) -> Result<Finish, StageError> {
        match self.mode {
            Mode::Eager => Ok(Finish::Nothing),
            Mode::Capture => Ok(Finish::EndCapture),
            Mode::Replay => {
                let captured = self.captured()?;
                if self.cursor != captured.signatures.len()
                    || self.arena.segments().len() != captured.segments.len()
                {
                    return Err(diverged("the step made fewer calls than the capture"));
                }
                self.stats.replays += 1;
                Ok(Finish::Replay)
            }
        }
    }

    /// The graph of the step just captured; past the limit another key's
    /// graph is dropped first.
    pub fn keep(&mut self, graph: G) {
        let Some(key) = self.key else { return };
        if self.graphs.len() >= self.limit && !self.graphs.contains_key(&key) {
            if let Some(old) = self.graphs.keys().next().copied() {
                self.graphs.remove(&old);
            }
        }
        self.graphs.insert(
            key,
            Captured {
                graph,
                signatures: std::mem::take(&mut self.signatures),
                segments: self.arena.segments().to_vec(),
            },
        );
        self.stats.captures += 1;
        self.mode = Mode::Eager;
    }

    /// The graph to launch for a [`Finish::Replay`].
    pub fn graph(&self) -> Option<&G> {
        self.key.and_then(|k| self.graphs.get(&k)).map(|c| &c.graph)
    }

    /// The step diverged (or its capture failed): its key's graph is
    /// dropped, and the step must run again eagerly.
    pub fn diverge(&mut self) {
        self.stats.divergences += 1;
        if let Some(k) = self.key {
            self.graphs.remove(&k);
            *self.diverged.entry(k).or_insert(0) += 1;
        }
        self.mode = Mode::Eager;
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
    use super::super::step_arena::bytes_of;
    use super::*;

    /// A host stand-in for a GPU step: "kernels" that read their inputs
    /// from the device arena at the offsets they were given, recorded
    /// instead of run while capturing and run again on replay, as a graph is.
    #[derive(Clone, Debug, PartialEq)]
    struct Op {
        input: usize,
        len: usize,
    }

    struct Device {
        mem: HostMemory,
        arena: <HostMemory as DeviceMemory>::Buffer,
        out: Vec<u32>,
        recording: Vec<Op>,
    }

    impl Device {
        fn run(&mut self, op: &Op) {
            let at = self.mem.address(&self.arena) + op.input as u64;
            let bytes = self.mem.read_at(at, op.len).unwrap();
            let sum = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .sum();
            self.out.push(sum);
        }

        fn upload(&mut self, graphs: &mut StepGraphs<Vec<Op>>) {
            for r in graphs.arena.take_dirty() {
                let bytes = graphs.arena.image()[r.clone()].to_vec();
                self.mem.write(&mut self.arena, r.start, &bytes).unwrap();
            }
        }
    }

    /// One step as the backend runs it: per "layer" stage the positions
    /// (shared by all layers) and a per-layer table, launch an op over each.
    fn step(
        g: &mut StepGraphs<Vec<Op>>,
        d: &mut Device,
        key: Option<StepKey>,
        positions: &[u32],
        layers: usize,
    ) -> Result<Vec<u32>, StageError> {
        g.begin(key, true);
        d.out.clear();
        d.recording.clear();
        for layer in 0..layers {
            let inputs = [positions.to_vec(), vec![layer as u32 * 10; positions.len()]];
            for (kind, values) in inputs.into_iter().enumerate() {
                let input = g.stage(&bytes_of(&values), kind as u8)?;
                let op = Op {
                    input,
                    len: 4 * values.len(),
                };
                let launch = g.enter(&[1, input as u64, op.len as u64])?;
                match (g.mode(), launch) {
                    (Mode::Eager, Launch::Run) => {
                        d.upload(g);
                        d.run(&op);
                    }
                    (Mode::Capture, Launch::Run) => d.recording.push(op),
                    (_, Launch::Skip) => {}
                    other => panic!("{other:?}"),
                }
            }
        }
        match g.finish()? {
            Finish::Nothing => {}
            Finish::EndCapture => {
                g.keep(std::mem::take(&mut d.recording));
                d.upload(g);
                for op in g.graph().unwrap().clone() {
                    d.run(&op);
                }
            }
            Finish::Replay => {
                d.upload(g);
                for op in g.graph().unwrap().clone() {
                    d.run(&op);
                }
            }
        }
        Ok(d.out.clone())
    }

    fn expected(positions: &[u32], layers: usize) -> Vec<u32> {
        (0..layers)
            .flat_map(|l| {
                [
                    positions.iter().sum(),
                    l as u32 * 10 * positions.len() as u32,
                ]
            })
            .collect()
    }

    #[test]
    fn a_key_is_captured_at_its_second_step_and_replayed_with_new_inputs() {
        let mem = HostMemory::new(1 << 16);
        let mut d = Device {
            arena: mem.alloc(1024).unwrap(),
            mem,
            out: Vec::new(),
            recording: Vec::new(),
        };
        let mut g = StepGraphs::new(4, 1024);
        let key = Some(StepKey(42));
        for pos in 0..6u32 {
            let positions = [pos, pos + 100];
            let out = step(&mut g, &mut d, key, &positions, 3).unwrap();
            assert_eq!(out, expected(&positions, 3), "step {pos}");
        }
        assert_eq!(
            g.stats,
            GraphStats {
                eager_steps: 1,
                captures: 1,
                replays: 4,
                divergences: 0
            }
        );
        // A replay copied only the positions (8 bytes), once for all layers.
        let before = g.arena.copied_bytes;
        step(&mut g, &mut d, key, &[9, 109], 3).unwrap();
        assert_eq!(g.arena.copied_bytes - before, 8);
        // Steps without a key never capture.
        for _ in 0..3 {
            step(&mut g, &mut d, None, &[1, 2], 3).unwrap();
        }
        assert_eq!(g.stats.captures, 1);
    }

    #[test]
    fn a_step_that_differs_from_its_capture_diverges_before_launching() {
        let mem = HostMemory::new(1 << 16);
        let mut d = Device {
            arena: mem.alloc(1024).unwrap(),
            mem,
            out: Vec::new(),
            recording: Vec::new(),
        };
        let mut g = StepGraphs::new(4, 1024);
        let key = Some(StepKey(7));
        for pos in 0..2 {
            step(&mut g, &mut d, key, &[pos, pos], 2).unwrap();
        }
        assert_eq!(g.len(), 1);
        // The same key with another shape (three rows): diverged at its
        // first segment, nothing ran.
        let e = step(&mut g, &mut d, key, &[1, 2, 3], 2).unwrap_err();
        assert!(matches!(e, StageError::Diverged(_)), "{e:?}");
        assert!(d.out.is_empty());
        g.diverge();
        assert!(g.is_empty());
        // The engine runs it again without a key: right.
        let out = step(&mut g, &mut d, None, &[1, 2, 3], 2).unwrap();
        assert_eq!(out, expected(&[1, 2, 3], 2));
        // Fewer calls than captured: diverged at the end, before the launch.
        for pos in 0..2 {
            step(&mut g, &mut d, key, &[pos, pos], 2).unwrap();
        }
        let e = step(&mut g, &mut d, key, &[1, 1], 1).unwrap_err();
        assert!(matches!(e, StageError::Diverged(ref m) if m.contains("fewer calls")));
        assert!(d.out.is_empty());
        g.diverge();
        // A key that keeps diverging is refused.
        for _ in 0..REFUSE_AFTER {
            for pos in 0..2 {
                let _ = step(&mut g, &mut d, key, &[pos, pos], 2);
            }
            if step(&mut g, &mut d, key, &[1], 2).is_err() {
                g.diverge();
            }
        }
        assert_eq!(g.begin(key, true), Mode::Eager);
        assert_eq!(g.begin(Some(StepKey(8)), false), Mode::Eager);
    }
}
