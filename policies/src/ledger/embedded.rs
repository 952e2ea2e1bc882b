//! The default ledger: one crash-safe file (redb, pure Rust) under the state directory.
//!
//! redb commits copy-on-write B-trees with a checksummed two-slot header, so a `kill -9`
//! or power cut at any moment leaves the last committed state. Settlements commit with
//! `Durability::Immediate` (fsync before [`Ledger::settle`] returns); reservations,
//! resizes and releases commit without a sync, since a crash forgets them anyway: one
//! process owns the file (redb locks it), so every hold found on opening belongs to a
//! process that died, and [`EmbeddedLedger::open`] releases them.

use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::{fits, Hold, HoldId, Ledger, LedgerError, Totals, UsageRecord, WindowId};

/// `window storage key` → settled and reserved (two little-endian f64).
const WINDOWS: TableDefinition<&str, &[u8]> = TableDefinition::new("windows");
/// Hold id → its windows and amounts (JSON `[[storage key, amount], ...]`).
const HOLDS: TableDefinition<u64, &[u8]> = TableDefinition::new("holds");
/// Settle time (ms, big-endian) and hold id → the usage record (JSON).
const USAGE: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("usage");

/// The ledger file's name inside the state directory.
pub const LEDGER_FILE: &str = "ledger.redb";

/// Counters in a file that survives restarts and crashes.
pub struct EmbeddedLedger {
    db: Database,
    path: PathBuf,
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

fn encode_totals(t: Totals) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&t.settled.to_le_bytes());
    out[8..].copy_from_slice(&t.reserved.to_le_bytes());
    out
}

fn decode_totals(bytes: &[u8]) -> Totals {
    let f = |range: std::ops::Range<usize>| {
        bytes
            .get(range)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(0.0, f64::from_le_bytes)
    };
    Totals {
        settled: f(0..8),
        reserved: f(8..16),
    }
}

fn usage_key(time_ms: u64, id: HoldId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&time_ms.to_be_bytes());
    key[8..].copy_from_slice(&id.to_be_bytes());
    key
}

type Held = Vec<(String, f64)>;

impl EmbeddedLedger {
    /// Opens (or creates) `dir/ledger.redb` and releases the holds a dead process left.
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
        let released = {
            let ledger = EmbeddedLedger {
                db,
                path: path.clone(),
            };
            ledger
                .release_orphans()
                .map_err(|e| file_error(e.to_string()))
                .map(|released| (ledger, released))
        };
        let (ledger, released) = released?;
        if released > 0 {
            tracing::warn!(
                path = %ledger.path.display(),
                released,
                "released the budget reservations of a process that stopped without settling them"
            );
        }
        Ok(ledger)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Releases every hold in the file; returns how many there were.
    fn release_orphans(&self) -> Result<usize, LedgerError> {
        self.write(Durability::Immediate, |tx| {
            let holds = tx.open_table(HOLDS).map_err(unavailable)?;
            let mut ids = Vec::new();
            for entry in holds.iter().map_err(unavailable)? {
                let (id, _) = entry.map_err(unavailable)?;
                ids.push(id.value());
            }
            drop(holds);
            for &id in &ids {
                drop_hold(tx, id)?;
            }
            // Make sure the tables exist for readers.
            tx.open_table(WINDOWS).map_err(unavailable)?;
            tx.open_table(USAGE).map_err(unavailable)?;
            Ok(ids.len())
        })
    }

    fn write<T>(
        &self,
        durability: Durability,
        body: impl FnOnce(&redb::WriteTransaction) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let mut tx = self.db.begin_write().map_err(unavailable)?;
        tx.set_durability(durability).map_err(unavailable)?;
        // On an error the transaction is dropped, which aborts it: all or nothing.
        let out = body(&tx)?;
        tx.commit().map_err(unavailable)?;
        Ok(out)
    }
}

fn read_totals(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Totals, LedgerError> {
    Ok(table
        .get(key)
        .map_err(unavailable)?
        .map_or_else(Totals::default, |v| decode_totals(v.value())))
}

fn add(
    tx: &redb::WriteTransaction,
    key: &str,
    settled: f64,
    reserved: f64,
) -> Result<(), LedgerError> {
    let mut windows = tx.open_table(WINDOWS).map_err(unavailable)?;
    let mut totals = read_totals(&windows, key)?;
    totals.settled += settled;
    totals.reserved = (totals.reserved + reserved).max(0.0);
    windows
        .insert(key, &encode_totals(totals)[..])
        .map_err(unavailable)?;
    Ok(())
}

fn read_hold(tx: &redb::WriteTransaction, id: HoldId) -> Result<Held, LedgerError> {
    let holds = tx.open_table(HOLDS).map_err(unavailable)?;
    let held = match holds.get(id).map_err(unavailable)? {
        Some(v) => serde_json::from_slice(v.value()).unwrap_or_default(),
        None => Vec::new(),
    };
    Ok(held)
}

/// Returns `id`'s amounts to their windows and forgets it.
fn drop_hold(tx: &redb::WriteTransaction, id: HoldId) -> Result<(), LedgerError> {
    for (key, amount) in read_hold(tx, id)? {
        add(tx, &key, 0.0, -amount)?;
    }
    tx.open_table(HOLDS)
        .map_err(unavailable)?
        .remove(id)
        .map_err(unavailable)?;
    Ok(())
}

impl Ledger for EmbeddedLedger {
    fn reserve(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        self.write(Durability::None, |tx| {
            let current = read_hold(tx, id)?;
            let keys: Vec<String> = holds.iter().map(|h| h.window.storage_key()).collect();
            {
                let windows = tx.open_table(WINDOWS).map_err(unavailable)?;
                for (i, (hold, key)) in holds.iter().zip(&keys).enumerate() {
                    let mut totals = read_totals(&windows, key)?;
                    if let Some((_, held)) = current.iter().find(|(k, _)| k == key) {
                        totals.reserved -= held;
                    }
                    fits(totals, hold.limit, hold.amount)
                        .map_err(|remaining| LedgerError::Short { hold: i, remaining })?;
                }
            }
            drop_hold(tx, id)?;
            let held: Held = keys
                .into_iter()
                .zip(holds)
                .map(|(key, hold)| (key, hold.amount))
                .collect();
            for (key, amount) in &held {
                add(tx, key, 0.0, *amount)?;
            }
            let json = serde_json::to_vec(&held).map_err(unavailable)?;
            tx.open_table(HOLDS)
                .map_err(unavailable)?
                .insert(id, &json[..])
                .map_err(unavailable)?;
            Ok(())
        })
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
        self.write(Durability::Immediate, |tx| {
            drop_hold(tx, id)?;
            for (window, amount) in spent {
                add(tx, &window.storage_key(), *amount, 0.0)?;
            }
            if let Some(record) = usage {
                let json = serde_json::to_vec(record).map_err(unavailable)?;
                tx.open_table(USAGE)
                    .map_err(unavailable)?
                    .insert(&usage_key(record.time_ms, id), &json[..])
                    .map_err(unavailable)?;
            }
            Ok(())
        })
    }

    fn release(&self, id: HoldId) -> Result<(), LedgerError> {
        self.write(Durability::None, |tx| drop_hold(tx, id))
    }

    fn totals(&self, window: &WindowId) -> Result<Totals, LedgerError> {
        let tx = self.db.begin_read().map_err(unavailable)?;
        let windows = tx.open_table(WINDOWS).map_err(unavailable)?;
        read_totals(&windows, &window.storage_key())
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
    fn reopening_keeps_spend_and_releases_orphaned_holds() {
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
