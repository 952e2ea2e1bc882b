//! Hot reload: the current policy lives in an `ArcSwap`; a reload validates the whole new
//! file and swaps it in atomically, or keeps the old policy and returns the error.
//!
//! Requests in flight keep the `Arc<Policy>` they started with. Budget counters and
//! rollback state carry over to the new policy wherever the same budget or an unchanged
//! split exists in both, so a reload neither refunds spend nor forgets a rollback.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;

use crate::engine_view::EngineView;
use crate::error::PolicyError;
use crate::explain::{explain, Explanation};
use crate::feedback::FeedbackBook;
use crate::ledger::Ledger;
use crate::measured::QualitySource;
use crate::metrics;
use crate::policy::Policy;
use crate::request::RouteRequest;
use crate::route::{route, Route};
use crate::route_error::RouteError;

/// Holds the current policy and swaps in new ones.
#[derive(Debug)]
pub struct PolicyStore {
    current: ArcSwap<Policy>,
    path: Option<PathBuf>,
    // Serializes reloads (file watcher and admin API) so state carry-over always starts
    // from the policy being replaced. Held only around validate + carry-over + swap.
    reload_lock: Mutex<()>,
    generation: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Modification time and length of the file as last read (loaded or refused), so the
    /// watcher reacts to edits made at any time after that read, and only once per edit.
    file_stamp: Mutex<Option<Stamp>>,
    /// Where `quality_from` figures are read, and its fingerprint when last read: the
    /// watcher reloads when it changes (a new measurement was stored).
    quality: Mutex<Option<Arc<dyn QualitySource>>>,
    quality_stamp: AtomicU64,
    /// Quality signals of served answers; kept across reloads.
    feedback: FeedbackBook,
}

type Stamp = (SystemTime, u64);

impl PolicyStore {
    /// A store holding `policy`, with no file to reload from.
    pub fn new(policy: Policy) -> Self {
        Self::with_path(policy, None)
    }

    /// Loads `path` and remembers it for [`PolicyStore::reload_from_file`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let path = path.as_ref();
        Ok(Self::with_path(
            Policy::load(path)?,
            Some(path.to_path_buf()),
        ))
    }

    /// Loads `path`, counting budgets in `ledger` (and every policy reloaded later).
    pub fn open_with_ledger(
        path: impl AsRef<Path>,
        ledger: Arc<dyn Ledger>,
    ) -> Result<Self, PolicyError> {
        let path = path.as_ref();
        Ok(Self::with_path(
            Policy::load(path)?.with_ledger(ledger),
            Some(path.to_path_buf()),
        ))
    }

    fn with_path(policy: Policy, path: Option<PathBuf>) -> Self {
        PolicyStore {
            current: ArcSwap::from_pointee(policy),
            path,
            reload_lock: Mutex::new(()),
            generation: AtomicU64::new(1),
            last_error: Mutex::new(None),
            file_stamp: Mutex::new(None),
            quality: Mutex::new(None),
            quality_stamp: AtomicU64::new(0),
            feedback: FeedbackBook::default(),
        }
    }

    /// Reads `quality_from` figures from `source` from now on: re-reads the file (when
    /// the store has one) so the current policy uses them, and every reload after.
    pub fn set_quality_source(
        &self,
        source: Arc<dyn QualitySource>,
    ) -> Result<Option<Arc<Policy>>, PolicyError> {
        *self.quality.lock().unwrap_or_else(|e| e.into_inner()) = Some(source);
        match self.path {
            Some(_) => self.reload_from_file().map(Some),
            None => Ok(None),
        }
    }

    /// Whether the quality source's measurements changed since the current policy read
    /// them, and the policy reads any.
    fn quality_changed(&self) -> bool {
        let source = self
            .quality
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match source {
            Some(source)
                if self.current().uses_measured_quality() || self.current().uses_split_evals() =>
            {
                source.fingerprint() != self.quality_stamp.load(Ordering::Acquire)
            }
            _ => false,
        }
    }

    /// `policy` with its `quality_from` figures read from the store's source, if any.
    fn resolve(&self, policy: Policy) -> Policy {
        let source = self
            .quality
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(source) = source else {
            return policy;
        };
        // Stamp before reading: a measurement stored mid-read shows up as a change later.
        self.quality_stamp
            .store(source.fingerprint(), Ordering::Release);
        policy.resolve_quality(source.as_ref())
    }

    /// Client scores and confidence of served answers, per checkpoint and split arm.
    pub fn feedback(&self) -> &FeedbackBook {
        &self.feedback
    }

    /// The current policy. Cheap (one atomic load and a reference-count increment).
    pub fn current(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// The file this store reloads from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Increases by one on every successful swap; starts at 1.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The error of the last failed reload, cleared by a successful one.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Routes with the current policy.
    pub fn route(&self, req: &RouteRequest, engine: &dyn EngineView) -> Result<Route, RouteError> {
        route(&self.current.load(), req, engine)
    }

    /// Explains a request under the current policy (nothing is reserved).
    pub fn explain(&self, req: &RouteRequest, engine: &dyn EngineView) -> Explanation {
        explain(&self.current.load(), req, engine)
    }

    /// Re-reads the store's file; on success swaps it in and returns it, on any error
    /// keeps the current policy and returns the error (with line and column).
    pub fn reload_from_file(&self) -> Result<Arc<Policy>, PolicyError> {
        let Some(path) = &self.path else {
            return Err(PolicyError::NoFile);
        };
        // Stamp before reading: an edit landing mid-read shows up as a newer stamp later.
        let stamp = fingerprint(path);
        let loaded = Policy::load(path);
        *self.file_stamp.lock().unwrap_or_else(|e| e.into_inner()) = stamp;
        self.install(loaded)
    }

    /// Validates `src` as a whole policy and swaps it in, or keeps the current one.
    pub fn reload_from_str(
        &self,
        src: &str,
        source_name: &str,
    ) -> Result<Arc<Policy>, PolicyError> {
        let parsed = Policy::from_toml_str_with_env(src, source_name, &|v| std::env::var(v).ok());
        self.install(parsed)
    }

    /// Swaps in an already validated policy, carrying state over.
    pub fn replace(&self, policy: Policy) -> Arc<Policy> {
        let _serial = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.swap_locked(policy)
    }

    fn install(&self, candidate: Result<Policy, PolicyError>) -> Result<Arc<Policy>, PolicyError> {
        let _serial = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        match candidate.map(|policy| self.resolve(policy)) {
            Ok(policy) => {
                let new = self.swap_locked(policy);
                tracing::info!(
                    source = new.source_name(),
                    generation = self.generation(),
                    "policy reloaded"
                );
                metrics::reload(true);
                Ok(new)
            }
            Err(e) => {
                tracing::error!(error = %e, "policy reload failed; keeping the current policy");
                *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                metrics::reload(false);
                Err(e)
            }
        }
    }

    fn swap_locked(&self, policy: Policy) -> Arc<Policy> {
        let old = self.current.load();
        // One ledger for the store's whole life: the new policy counts where the old did.
        let mut policy = policy.with_ledger(Arc::clone(old.ledger()));
        policy.inherit_state(&old);
        // After the carry-over: a kept monitor must see what the new measurements say.
        policy.roll_back_on_evals();
        let new = Arc::new(policy);
        self.current.store(Arc::clone(&new));
        self.generation.fetch_add(1, Ordering::AcqRel);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
        new
    }

    /// Starts a thread that checks the file's modification time and size every
    /// `interval` and reloads when either has changed and then stayed the same for one
    /// more interval (a file being written is not read). Errors are logged and the old
    /// policy kept; the thread stops when the returned watcher is dropped.
    pub fn watch(self: &Arc<Self>, interval: Duration) -> Result<PolicyWatcher, PolicyError> {
        let path = self.path.clone().ok_or(PolicyError::NoFile)?;
        let store = Arc::clone(self);
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("policy-watch".into())
            .spawn(move || {
                // A change is read once the file has stood still for a whole interval:
                // an editor that truncates and rewrites in place leaves a moment where
                // the file is empty or half written, and a half that happens to parse
                // would be swapped in.
                let mut settling = None;
                while !stop_flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(interval);
                    if stop_flag.load(Ordering::Acquire) {
                        break;
                    }
                    let now = fingerprint(&path);
                    let seen = *store.file_stamp.lock().unwrap_or_else(|e| e.into_inner());
                    if now.is_some() && now == seen && store.quality_changed() {
                        settling = None;
                        // A measurement was stored: the same file, other figures.
                        let _ = store.reload_from_file();
                    } else if now.is_none() || now == seen {
                        settling = None;
                    } else if settling != now {
                        settling = now;
                    } else {
                        settling = None;
                        // `install` logs the outcome either way.
                        let _ = store.reload_from_file();
                    }
                }
            })
            .map_err(|source| PolicyError::Watch { source })?;
        Ok(PolicyWatcher {
            stop,
            thread: Some(thread),
        })
    }
}

/// Modification time and length; `None` while the file is missing (mid-rename).
fn fingerprint(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Stops the watch thread when dropped.
#[derive(Debug)]
pub struct PolicyWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for PolicyWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
