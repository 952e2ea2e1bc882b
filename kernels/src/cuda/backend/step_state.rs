//! The step graphs' state behind the backend's mutex (`step.rs` runs it):
//! its own module so that the backend's struct can hold it without the
//! backend and its step code naming each other.

use std::thread::ThreadId;

use cudarc::driver::{CudaGraph, CudaSlice};

use super::super::step_graph::StepGraphs;

/// Graphs kept: the checkpoints × batch shapes a server cycles through.
pub(super) const GRAPHS: usize = 64;
/// The arena's first size; eager steps grow it.
pub(super) const ARENA_BYTES: usize = 256 << 10;

/// A captured graph.
pub(super) struct Graph(pub(super) CudaGraph);

// SAFETY: a graph is touched only under the step state's mutex, one
// thread at a time, which is all the driver asks of graph objects.
unsafe impl Send for Graph {}

/// The step state behind the backend's mutex.
pub(crate) struct StepState {
    pub(super) graphs: StepGraphs<Graph>,
    /// The device side of `graphs.arena`, allocated at the first step.
    pub(super) arena: Option<CudaSlice<u8>>,
    /// Why the current capture cannot be kept (an allocation inside it).
    pub(super) broken: Option<String>,
    /// The thread whose keyed step is open, if any.
    pub(super) owner: Option<ThreadId>,
    /// Activations replaced inside a capture, freed once it ends (a free
    /// inside it would be recorded into the graph).
    pub(super) graveyard: Vec<CudaSlice<f32>>,
}

impl Default for StepState {
    fn default() -> Self {
        StepState {
            graphs: StepGraphs::new(GRAPHS, ARENA_BYTES),
            arena: None,
            broken: None,
            owner: None,
            graveyard: Vec::new(),
        }
    }
}
