//! While one thread captures a step into a CUDA graph, everything put on
//! the backend's stream is recorded into that graph, whichever thread puts
//! it there: a weight uploaded by a loading thread would land in the graph
//! (and a pageable copy would break the capture). The gate holds other
//! threads' stream work back until the capture ends; the capturing thread
//! itself passes.

use std::sync::{Condvar, Mutex};
use std::thread::ThreadId;

/// The gate; shared by the backend and its memory.
#[derive(Default)]
pub struct CaptureGate {
    owner: Mutex<Option<ThreadId>>,
    opened: Condvar,
}

impl CaptureGate {
    /// The current thread starts capturing (once another's capture ends).
    pub fn close(&self) {
        let me = std::thread::current().id();
        let Ok(mut owner) = self.owner.lock() else {
            return;
        };
        while owner.is_some_and(|o| o != me) {
            owner = match self.opened.wait(owner) {
                Ok(o) => o,
                Err(_) => return,
            };
        }
        *owner = Some(me);
    }

    /// The capture ended (a no-op on a thread that was not capturing).
    pub fn open(&self) {
        let me = std::thread::current().id();
        if let Ok(mut owner) = self.owner.lock() {
            if *owner == Some(me) {
                *owner = None;
                self.opened.notify_all();
            }
        }
    }

    /// Returns once the current thread may put work on the stream.
    pub fn pass(&self) {
        let me = std::thread::current().id();
        let Ok(mut owner) = self.owner.lock() else {
            return;
        };
        while owner.is_some_and(|o| o != me) {
            owner = match self.opened.wait(owner) {
                Ok(o) => o,
                Err(_) => return,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn other_threads_wait_for_the_capture_and_the_capturer_passes() {
        let gate = Arc::new(CaptureGate::default());
        gate.close();
        gate.pass(); // the capturing thread itself
        let passed = Arc::new(AtomicBool::new(false));
        let other = {
            let (gate, passed) = (Arc::clone(&gate), Arc::clone(&passed));
            std::thread::spawn(move || {
                gate.open(); // not its capture: no effect
                gate.pass();
                passed.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!passed.load(Ordering::SeqCst), "passed during the capture");
        gate.open();
        other.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
    }
}
