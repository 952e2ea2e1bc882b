//! The backend's side of step graphs (`step_graph.rs`): the device arena
//! the step's inputs are staged in, the stream capture, the replay.
//!
//! Every launching call of the trait goes through [`CudaBackend::enter`]
//! with its signature, and stages its small inputs with
//! [`CudaBackend::stage`]. An eager step copies what it stages at once; a
//! capture or a replay copies everything that changed just before the
//! graph's launch, at [`CudaBackend::end`].
//!
//! One keyed step at a time owns the arena (the executor's; the engine
//! also runs a smoke step on a loading thread): a step without a key, or a
//! keyed one while another thread's is open, uploads each input into a
//! buffer of its own, as before graphs, and launches as it goes.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::thread::ThreadId;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, DevicePtr};

use super::super::capture_gate::Pass;
use super::super::step_arena::StageError;
use super::super::step_graph::{Finish, Launch, Mode};
use super::step_state::{Graph, StepState, ARENA_BYTES};
use super::{driver_err, poisoned, CudaBackend};
use crate::{KernelError, StepKey};

/// What a staged segment holds (segments share only within a kind).
pub(super) mod kind {
    pub const TOKENS: u8 = 0;
    pub const POSITIONS: u8 = 1;
    pub const FREQUENCIES: u8 = 2;
    pub const BLOCK_TABLES: u8 = 3;
    pub const ROW_SEQ: u8 = 4;
    pub const ROW_POS: u8 = 5;
    /// A launch's weight addresses (`weight_refs.rs`).
    pub const WEIGHTS: u8 = 6;
    /// A batched GEMM's B and C pointer arrays (`gemm_pointers.rs`).
    pub const GEMM_OPERANDS: u8 = 7;
}

/// Operation ids, the first word of a signature.
pub(super) mod op {
    pub const EMBED: u64 = 1;
    pub const RMS_NORM: u64 = 2;
    pub const MATMUL: u64 = 3;
    pub const ROPE: u64 = 4;
    pub const ATTENTION: u64 = 5;
    pub const ELEMENTWISE: u64 = 6;
    pub const RMS_NORM_HEADS: u64 = 7;
    pub const COPY_ROWS: u64 = 8;
    pub const MATMUL_PREFILL: u64 = 9;
}

/// A staged input's device address, and the buffer of its own that holds
/// it outside the arena (kept until the launch that reads it is queued).
pub(super) struct Staged<'a> {
    pub addr: u64,
    /// Dropped before the pass (fields drop in order): a free is stream
    /// work too.
    _own: Option<CudaSlice<u8>>,
    _pass: Option<Pass<'a>>,
}

/// What [`CudaBackend::enter`] decided, and the pass that keeps another
/// thread's capture from beginning before the call's launches are queued.
pub(super) struct Entered<'a> {
    pub launch: Launch,
    _pass: Pass<'a>,
}

fn me() -> ThreadId {
    std::thread::current().id()
}

fn diverged(e: StageError) -> KernelError {
    match e {
        StageError::Diverged(why) => KernelError::StepDiverged(why),
        StageError::Full { need } => {
            KernelError::StepDiverged(format!("the step arena must grow to {need} bytes"))
        }
    }
}

impl CudaBackend {
    fn step_state(&self) -> Result<MutexGuard<'_, StepState>, KernelError> {
        self.step.lock().map_err(|_| poisoned("step state"))
    }

    /// The device address of `buf` (event tracking is off: no side effect).
    pub(super) fn addr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        buf.device_ptr(self.dev.stream()).0
    }

    /// See [`crate::Backend::begin_step`].
    pub(super) fn begin(&self, key: Option<StepKey>) {
        let Ok(mut guard) = self.step.lock() else {
            return;
        };
        let st = &mut *guard;
        if st.owner == Some(me()) {
            // The last step of this thread neither ended nor aborted.
            self.close_capture(st);
            st.owner = None;
        }
        let Some(key) = key else {
            return;
        };
        if st.owner.is_some() {
            return; // another thread's keyed step is open: this one is plain
        }
        st.owner = Some(me());
        st.broken = None;
        let ready = st.arena.is_some() || self.grow_arena(st, ARENA_BYTES).is_ok();
        if st.graphs.begin(Some(key), ready) != Mode::Capture {
            return;
        }
        // Other threads' work under way may need the state's lock to
        // finish: wait for it without holding the lock.
        drop(guard);
        self.gate.close();
        let began = self
            .dev
            .stream()
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        match began {
            Ok(()) => self.capturing.store(true, Ordering::SeqCst),
            Err(e) => {
                tracing::warn!("cuda: a step capture could not begin ({e:?}); running it eagerly");
                self.gate.open();
                if let Ok(mut st) = self.step.lock() {
                    st.graphs.diverge();
                }
            }
        }
    }

    /// Ends a capture the step left open (it failed), dropping the graph;
    /// whether there was one.
    fn close_capture(&self, st: &mut StepState) -> bool {
        let open = self.capturing.swap(false, Ordering::SeqCst);
        if open {
            // The capture's graph, if any, is dropped unlaunched.
            let _ = self.dev.stream().end_capture(CUgraphInstantiate_flags(0));
            self.gate.open();
            st.graphs.diverge();
        }
        st.graveyard.clear();
        open
    }

    /// See [`crate::Backend::abort_step`].
    pub(super) fn abort(&self) {
        if let Ok(mut st) = self.step.lock() {
            if st.owner != Some(me()) {
                return;
            }
            st.owner = None;
            if !self.close_capture(&mut st) && st.graphs.mode() != Mode::Eager {
                st.graphs.diverge();
            }
        }
    }

    /// A launching call of `signature`: run its launches, or skip them.
    pub(super) fn enter(&self, signature: &[u64]) -> Result<Entered<'_>, KernelError> {
        let pass = self.gate.pass();
        let mut st = self.step_state()?;
        let launch = if st.owner != Some(me()) {
            Launch::Run
        } else if let Some(why) = &st.broken {
            return Err(KernelError::StepDiverged(why.clone()));
        } else {
            st.graphs.enter(signature).map_err(diverged)?
        };
        Ok(Entered {
            launch,
            _pass: pass,
        })
    }

    /// A pass to allocate (and free) under, or none inside this thread's
    /// capture (where nothing may be allocated): then the capture is
    /// marked broken for `why`, and `old` waits for its end to be freed.
    pub(super) fn outside_capture(
        &self,
        why: &str,
        old: Option<CudaSlice<f32>>,
    ) -> Option<Pass<'_>> {
        let pass = self.gate.pass();
        // Another thread's capture has ended by now: one still open is ours.
        if !self.capturing.load(Ordering::SeqCst) {
            drop(old);
            return Some(pass);
        }
        if let Ok(mut st) = self.step.lock() {
            st.broken = Some(format!("{why} inside a capture"));
            st.graveyard.extend(old);
        }
        None
    }

    /// Whether this thread's keyed step is open (its inputs go to the
    /// arena).
    pub(super) fn keyed(&self) -> bool {
        self.step
            .lock()
            .map(|st| st.owner == Some(me()))
            .unwrap_or(false)
    }

    fn grow_arena(&self, st: &mut StepState, bytes: usize) -> Result<(), KernelError> {
        st.arena = None; // free first
        let buf = self
            .dev
            .stream()
            .alloc_zeros::<u8>(bytes)
            .map_err(driver_err("cuMemAlloc (step arena)"))?;
        st.arena = Some(buf);
        st.graphs.arena.grown(bytes);
        Ok(())
    }

    /// `bytes` staged for this step's launches.
    pub(super) fn stage(&self, bytes: &[u8], kind: u8) -> Result<Staged<'_>, KernelError> {
        let mut st = self.step_state()?;
        if st.owner != Some(me()) {
            drop(st);
            let pass = self.gate.pass();
            let own = self
                .dev
                .stream()
                .clone_htod(bytes)
                .map_err(driver_err("cuMemcpyHtoD (step inputs)"))?;
            return Ok(Staged {
                addr: self.addr(&own),
                _own: Some(own),
                _pass: Some(pass),
            });
        }
        let st = &mut *st;
        let offset = match st.graphs.stage(bytes, kind) {
            Ok(offset) => offset,
            Err(StageError::Full { need }) if st.graphs.mode() == Mode::Eager => {
                let bytes_now = need.max(2 * st.graphs.arena.capacity());
                self.grow_arena(st, bytes_now)?;
                st.graphs.stage(bytes, kind).map_err(diverged)?
            }
            Err(e) => return Err(diverged(e)),
        };
        if st.graphs.mode() == Mode::Eager {
            self.copy_dirty(st)?;
        }
        let base = st
            .arena
            .as_ref()
            .map(|a| self.addr(a))
            .ok_or_else(|| KernelError::Device("no step arena".into()))?;
        Ok(Staged {
            addr: base + offset as u64,
            _own: None,
            _pass: None,
        })
    }

    /// The arena's changed bytes to the device, in stream order.
    fn copy_dirty(&self, st: &mut StepState) -> Result<(), KernelError> {
        let ranges = st.graphs.arena.take_dirty();
        let Some(arena) = st.arena.as_mut() else {
            return Err(KernelError::Device("no step arena".into()));
        };
        for r in ranges {
            let mut dst = arena.slice_mut(r.clone());
            self.dev
                .stream()
                .memcpy_htod(&st.graphs.arena.image()[r], &mut dst)
                .map_err(driver_err("cuMemcpyHtoD (step inputs)"))?;
        }
        Ok(())
    }

    /// See [`crate::Backend::end_step`].
    pub(super) fn end(&self) -> Result<(), KernelError> {
        let mut st = self.step_state()?;
        let st = &mut *st;
        if st.owner != Some(me()) {
            return Ok(());
        }
        st.owner = None;
        let finish = match (st.graphs.finish(), st.broken.take()) {
            (Ok(Finish::EndCapture), Some(why)) => Err(KernelError::StepDiverged(why)),
            (finish, _) => finish.map_err(diverged),
        };
        let finish = match finish {
            Ok(f) => f,
            Err(e) => {
                if !self.close_capture(st) {
                    st.graphs.diverge();
                }
                return Err(e);
            }
        };
        match finish {
            Finish::Nothing => return Ok(()),
            Finish::EndCapture => {
                self.capturing.store(false, Ordering::SeqCst);
                let graph = self.dev.stream().end_capture(CUgraphInstantiate_flags(0));
                self.gate.open();
                st.graveyard.clear();
                match graph {
                    Ok(Some(g)) => st.graphs.keep(Graph(g)),
                    other => {
                        st.graphs.diverge();
                        return Err(KernelError::StepDiverged(format!(
                            "the capture failed: {:?}",
                            other.err()
                        )));
                    }
                }
            }
            Finish::Replay => {}
        }
        self.copy_dirty(st)?;
        let graph = st
            .graphs
            .graph()
            .ok_or_else(|| KernelError::StepDiverged("the graph is gone".into()))?;
        graph.0.launch().map_err(driver_err("cuGraphLaunch"))
    }

    /// Captures, replays, eager steps and divergences so far.
    pub fn graph_stats(&self) -> super::super::step_graph::GraphStats {
        self.step
            .lock()
            .map(|st| st.graphs.stats)
            .unwrap_or_default()
    }

    /// Bytes of step inputs copied to the device so far.
    pub fn staged_bytes(&self) -> u64 {
        self.step
            .lock()
            .map(|st| st.graphs.arena.copied_bytes)
            .unwrap_or(0)
    }
}
