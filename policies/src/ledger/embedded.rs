//! The default ledger: one crash-safe file (redb, pure Rust) under the state directory.
//!
//! redb commits copy-on-write B-trees with a checksummed two-slot header, so a `kill -9`
//! or power cut at any moment leaves the last committed state. Only settled spend and
//! usage records go to the file, each settlement one transaction with
//! `Durability::Immediate` (fsync before [`Ledger::settle`] returns). Holds live in
//! memory: one process owns the file (redb locks it), so the holds of a process that
//! died are gone with it, which is the documented outcome (released, not counted).
//! Reservations therefore never wait for the disk; a window's settled spend is read from
//! the file the first time the process touches the window and kept current after.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::memory::State;
use super::{Hold, HoldId, Ledger, LedgerError, Totals, UsageRecord, WindowId};

/// `window storage key` → settled spend (a little-endian f64).
const SETTLED: TableDefinition<&str, f64> = TableDefinition::new("settled");
/// Settle time (ms, big-endian) and hold id → the usage record (JSON).
const USAGE: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("usage");

/// The ledger file's name inside the state directory.
pub const LEDGER_FILE: &str = "ledger.redb";

/// Counters in a file that survives restarts and crashes.
pub struct EmbeddedLedger {
    db: Database,
    path: PathBuf,
    /// Holds, and the counters of every window touched since opening (settled as the
    /// file says). Never held across disk I/O other than a window's first read.
    state: Mutex<State>,
}

impl std::fmt::Debug for EmbeddedLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedLedger")
            .field("path", &self.path)
            .finish()
    }
}

/// Why the ledger file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The state directory could not be made.
    #[error("cannot create the state directory {path}: {source}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is held by another process or is not a ledger.
    #[error("cannot open the spend ledger {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why (another switchyard using the same --state-dir, a corrupt file...).
        reason: String,
    },
}

fn unavailable(error: impl std::fmt::Display) -> LedgerError {
    LedgerError::Unavailable {
        store: "embedded",
        reason: error.to_string(),
    }
}

fn usage_key(time_ms: u64, id: HoldId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&time_ms.to_be_bytes());
    key[8..].copy_from_slice(&id.to_be_bytes());
    key
}

impl EmbeddedLedger {
    /// Opens (or creates) `dir/ledger.redb`.
    pub fn open(dir: &Path) -> Result<Self, OpenError> {
        std::fs::create_dir_all(dir).map_err(|source| OpenError::StateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(LEDGER_FILE);
        let file_error = |reason: String| OpenError::File {
            path: path.clone(),
            reason,
        };
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => file_error(
                "another process has it open; give each switchyard its own --state-dir, or \
                 share spend between instances with --ledger redis://..."
                    .to_owned(),
            ),
            other => file_error(other.to_string()),
        })?;
        // Create the tables, so that readers find them.
        let created = (|| -> Result<(), redb::Error> {
            let tx = db.begin_write()?;
            tx.open_table(SETTLED)?;
            tx.open_table(USAGE)?;
            tx.commit()?;
            Ok(())
        })();
        created.map_err(|e| file_error(e.to_string()))?;
        Ok(EmbeddedLedger {
            db,
            path: path.clone(),
            state: Mutex::new(State::default()),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain numbers: still usable after a panic elsewhere (see MemoryLedger).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure `state` has `window`, its settled spend read from the file.
    fn load(&self, state: &mut State, window: &WindowId) -> Result<(), LedgerError> {
        if state.windows.contains_key(window) {
            return Ok(());
        }
        let tx = self.db.begin_read().map_err(unavailable)?;
        let table = tx.open_table(SETTLED).map_err(unavailable)?;
        let settled = table
            .get(window.storage_key().as_str())
            .map_err(unavailable)?
            .map_or(0.0, |v| v.value());
        state.windows.insert(
            window.clone(),
            Totals {
                settled,
                reserved: 0.0,
            },
        );
        Ok(())
    }

    /// Adds `spent` to the file and appends `usage`, in one durable transaction.
    fn write_settlement(
        &self,
        id: HoldId,
        spent: &[(WindowId, f64)],
        usage: Option<&UsageRecord>,
    ) -> Result<(), LedgerError> {
        let mut tx = self.db.begin_write().map_err(unavailable)?;
        tx.set_durability(Durability::Immediate)
            .map_err(unavailable)?;
        {
            let mut settled = tx.open_table(SETTLED).map_err(unavailable)?;
            for (window, amount) in spent {
                let key = window.storage_key();
                let before = settled
                    .get(key.as_str())
                    .map_err(unavailable)?
                    .map_or(0.0, |v| v.value());
                settled
                    .insert(key.as_str(), before + amount)
                    .map_err(unavailable)?;
            }
        }
        if let Some(record) = usage {
            let json = serde_json::to_vec(record).map_err(unavailable)?;
            tx.open_table(USAGE)
                .map_err(unavailable)?
                .insert(&usage_key(record.time_ms, id), &json[..])
                .map_err(unavailable)?;
        }
        // Dropped without a commit on any error above: all or nothing.
        tx.commit().map_err(unavailable)
    }
}

impl Ledger for EmbeddedLedger {
    fn reserve(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        let mut state = self.lock();
        for hold in holds {
            self.load(&mut state, &hold.window)?;
        }
        state.check(id, holds)?;
        state.hold(id, holds);
        Ok(())
    }

    fn resize(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        self.reserve(id, holds)
    }

    fn settle(
        &self,
        id: HoldId,
        spent: &[(WindowId, f64)],
        usage: Option<&UsageRecord>,
    ) -> Result<(), LedgerError> {
        // Loaded before the write: a window first read after it would count it twice.
        {
            let mut state = self.lock();
            for (window, _) in spent {
                self.load(&mut state, window)?;
            }
        }
        // The hold stays in place while the disk works: the spend is counted as held
        // until it is counted as settled, never neither.
        let written = self.write_settlement(id, spent, usage);
        let mut state = self.lock();
        state.drop_hold(id);
        for (window, amount) in spent {
            // Counted even when the write failed: the request ran (the caller logs it).
            state.windows.entry(window.clone()).or_default().settled += amount;
        }
        written
    }

    fn release(&self, id: HoldId) -> Result<(), LedgerError> {
        self.lock().drop_hold(id);
        Ok(())
    }

    fn totals(&self, window: &WindowId) -> Result<Totals, LedgerError> {
        let mut state = self.lock();
        self.load(&mut state, window)?;
        Ok(state.totals(window))
    }

    fn usage_since(&self, since_ms: u64, limit: usize) -> Result<Vec<UsageRecord>, LedgerError> {
        let tx = self.db.begin_read().map_err(unavailable)?;
        let usage = tx.open_table(USAGE).map_err(unavailable)?;
        let mut out = Vec::new();
        let from = usage_key(since_ms, 0);
        for entry in usage
            .range::<&[u8; 16]>(&from..)
            .map_err(unavailable)?
            .take(limit)
        {
            let (_, value) = entry.map_err(unavailable)?;
            match serde_json::from_slice(value.value()) {
                Ok(record) => out.push(record),
                Err(error) => {
                    tracing::warn!(%error, path = %self.path.display(), "skipping an unreadable usage record")
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_ledger_keeps_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        super::super::contract::check(&EmbeddedLedger::open(dir.path()).unwrap());
    }

    #[test]
    fn reopening_keeps_spend_and_forgets_holds() {
        let dir = tempfile::tempdir().unwrap();
        let window = WindowId {
            key: "k".into(),
            index: 3,
            ends_at: 10,
        };
        let hold = |amount| Hold {
            window: window.clone(),
            limit: 100.0,
            amount,
        };
        {
            let ledger = EmbeddedLedger::open(dir.path()).unwrap();
            ledger.reserve(1, &[hold(40.0)]).unwrap();
            ledger.settle(1, &[(window.clone(), 25.0)], None).unwrap();
            ledger.reserve(2, &[hold(50.0)]).unwrap();
            // A second process cannot take the same file.
            let second = EmbeddedLedger::open(dir.path()).unwrap_err();
            assert!(second.to_string().contains("another process"), "{second}");
        }
        let ledger = EmbeddedLedger::open(dir.path()).unwrap();
        assert_eq!(
            ledger.totals(&window).unwrap(),
            Totals {
                settled: 25.0,
                reserved: 0.0
            }
        );
    }
}
