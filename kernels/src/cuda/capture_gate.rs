//! While one thread captures a step into a CUDA graph, everything put on
//! the backend's stream is recorded into that graph, whichever thread puts
//! it there: a weight uploaded by a loading thread would land in the graph
//! (and a pageable copy would break the capture). The gate holds other
//! threads' stream work back until the capture ends, and a capture waits
//! for the work other threads have under way; the capturing thread itself
//! passes.

use std::sync::{Condvar, Mutex};
use std::thread::ThreadId;

#[derive(Default)]
struct State {
    /// The capturing thread.
    owner: Option<ThreadId>,
    /// Other threads' passes not yet dropped.
    active: usize,
}

/// The gate; shared by the backend and its memory.
#[derive(Default)]
pub struct CaptureGate {
    state: Mutex<State>,
    changed: Condvar,
}

/// Held while a thread puts work on the stream; dropping it lets a
/// waiting capture begin.
pub struct Pass<'a> {
    gate: Option<&'a CaptureGate>,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.gate {
            if let Ok(mut s) = gate.state.lock() {
                s.active -= 1;
                gate.changed.notify_all();
            }
        }
    }
}

fn me() -> ThreadId {
    std::thread::current().id()
}

impl CaptureGate {
    /// The current thread starts capturing, once another's capture ended
    /// and no other thread holds a pass. Call it holding no pass of its own.
    pub fn close(&self) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        while s.owner.is_some_and(|o| o != me()) || s.active > 0 {
            s = match self.changed.wait(s) {
                Ok(s) => s,
                Err(_) => return,
            };
        }
        s.owner = Some(me());
    }

    /// The capture ended (a no-op on a thread that was not capturing).
    pub fn open(&self) {
        if let Ok(mut s) = self.state.lock() {
            if s.owner == Some(me()) {
                s.owner = None;
                self.changed.notify_all();
            }
        }
    }

    /// Returns once the current thread may put work on the stream; hold
    /// the pass until that work is queued.
    pub fn pass(&self) -> Pass<'_> {
        let Ok(mut s) = self.state.lock() else {
            return Pass { gate: None };
        };
        if s.owner == Some(me()) {
            return Pass { gate: None };
        }
        while s.owner.is_some() {
            s = match self.changed.wait(s) {
                Ok(s) => s,
                Err(_) => return Pass { gate: None },
            };
        }
        s.active += 1;
        Pass { gate: Some(self) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use super::*;

    #[test]
    fn other_threads_wait_for_the_capture_and_the_capturer_passes() {
        let gate = Arc::new(CaptureGate::default());
        gate.close();
        drop(gate.pass()); // the capturing thread itself
        let passed = Arc::new(AtomicBool::new(false));
        let other = {
            let (gate, passed) = (Arc::clone(&gate), Arc::clone(&passed));
            std::thread::spawn(move || {
                gate.open(); // not its capture: no effect
                let _pass = gate.pass();
                passed.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!passed.load(Ordering::SeqCst), "passed during the capture");
        gate.open();
        other.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
    }

    #[test]
    fn a_capture_waits_for_work_under_way() {
        let gate = Arc::new(CaptureGate::default());
        let (held, release) = (mpsc::channel(), mpsc::channel::<()>());
        let worker = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                let _pass = gate.pass();
                held.0.send(()).unwrap();
                release.1.recv().unwrap();
            })
        };
        held.1.recv().unwrap();
        let closed = Arc::new(AtomicBool::new(false));
        let capturer = {
            let (gate, closed) = (Arc::clone(&gate), Arc::clone(&closed));
            std::thread::spawn(move || {
                gate.close();
                closed.store(true, Ordering::SeqCst);
                gate.open();
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !closed.load(Ordering::SeqCst),
            "closed while work was under way"
        );
        release.0.send(()).unwrap();
        worker.join().unwrap();
        capturer.join().unwrap();
        assert!(closed.load(Ordering::SeqCst));
    }
}
