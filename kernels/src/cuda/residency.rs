//! Where each checkpoint's weights are: device memory within a byte
//! budget, else host memory (pinned on a GPU) within its own budget, else
//! only on disk. Making a checkpoint device-resident evicts the least
//! recently used ones that the running batch does not need, device to host
//! and host to disk.
//!
//! A move up is asynchronous: [`Residency::prefetch`] starts the copy on
//! the copy stream (`copy_stream.rs`) and returns, so the next batch's
//! checkpoint moves up while the current batch runs. Until the copy has
//! landed the checkpoint is [`Tier::Uploading`]: [`Residency::ready`]
//! gives no table entries for it, [`Residency::swap_to`] refuses to point a
//! table at it, and eviction never picks it (its buffer is being written).
//!
//! This is bookkeeping over [`CopyStream`], the same on a GPU and on the
//! host stand-in; the registry and routing read [`Residency::tier`].

use std::collections::HashMap;
use std::hash::Hash;

use super::copy_stream::CopyStream;
use super::pointer_table::PointerTable;
use super::upload::{Placed, WeightImage};
use super::CudaError;

/// A checkpoint's fastest copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// In device memory, ready to run.
    Device,
    /// Being copied up from host memory; not to be run yet.
    Uploading,
    /// In (pinned) host memory.
    Host,
    /// Only in its file.
    Disk,
}

/// Whether a checkpoint can run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Device-resident: its pointer-table entries.
    Ready(Vec<u64>),
    /// Its copy up is in flight.
    Copying,
}

struct Entry<M: CopyStream> {
    /// Where the tensors lie in the image (the same in every tier).
    placed: Vec<Placed>,
    bytes: usize,
    device: Option<M::Buffer>,
    /// The copy up in flight, and the host bytes it reads.
    upload: Option<(M::Copy, M::Pinned)>,
    host: Option<M::Pinned>,
    /// The pointer-table entries of the device copy.
    entries: Vec<u64>,
    /// Which upload the device copy is (a table pointing at an earlier
    /// one must copy again).
    upload_id: u64,
    last_used: u64,
}

impl<M: CopyStream> Entry<M> {
    fn empty(bytes: usize) -> Self {
        Entry {
            placed: Vec::new(),
            bytes,
            device: None,
            upload: None,
            host: None,
            entries: Vec::new(),
            upload_id: 0,
            last_used: 0,
        }
    }

    fn holds_host_bytes(&self) -> bool {
        self.host.is_some() || self.upload.is_some()
    }

    /// Device-resident and not being written: may be evicted or run.
    fn settled_on_device(&self) -> bool {
        self.device.is_some() && self.upload.is_none()
    }
}

/// Byte budgets of the two memory tiers.
#[derive(Clone, Copy, Debug)]
pub struct Budgets {
    pub device: usize,
    pub host: usize,
}

pub struct Residency<K, M: CopyStream> {
    memory: M,
    budgets: Budgets,
    entries: HashMap<K, Entry<M>>,
    clock: u64,
    moves: Moves,
}

/// Tier moves made so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moves {
    pub uploads: u64,
    pub device_to_host: u64,
    pub host_to_disk: u64,
}

/// A pointer table over checkpoints of a [`Residency`]: keyed by the
/// checkpoint and its upload, so that a checkpoint evicted and uploaded
/// again (at another address) is copied into the table again.
pub type ResidentTable<K, M> = PointerTable<(K, u64), M>;

impl<K: Eq + Hash + Clone + std::fmt::Debug, M: CopyStream> Residency<K, M> {
    pub fn new(memory: M, budgets: Budgets) -> Self {
        Residency {
            memory,
            budgets,
            entries: HashMap::new(),
            clock: 0,
            moves: Moves::default(),
        }
    }

    pub fn memory(&self) -> &M {
        &self.memory
    }

    pub fn budgets(&self) -> Budgets {
        self.budgets
    }

    /// Where `key` is now (an upload that has landed is on the device).
    pub fn tier(&self, key: &K) -> Tier {
        match self.entries.get(key) {
            Some(e) if e.device.is_some() => match &e.upload {
                Some((copy, _)) if !self.memory.landed(copy).unwrap_or(false) => Tier::Uploading,
                _ => Tier::Device,
            },
            Some(e) if e.host.is_some() => Tier::Host,
            _ => Tier::Disk,
        }
    }

    pub fn device_used(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.device.is_some())
            .map(|e| e.bytes)
            .sum()
    }

    /// Host bytes held: host copies, and the sources of copies in flight.
    pub fn host_used(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.holds_host_bytes())
            .map(|e| e.bytes)
            .sum()
    }

    pub fn moves(&self) -> Moves {
        self.moves
    }

    /// Keeps `image` in the host tier (a checkpoint just read from disk),
    /// moving least recently used host copies to disk to make room.
    pub fn insert_host(&mut self, key: K, image: WeightImage) -> Result<(), CudaError> {
        let bytes = image.bytes.len();
        self.make_host_room(bytes, std::slice::from_ref(&key))?;
        let pinned = self.memory.pin(&image.bytes)?;
        self.clock += 1;
        let entry = self.entries.entry(key).or_insert(Entry::empty(bytes));
        entry.bytes = bytes;
        entry.placed = image.placed;
        entry.host = Some(pinned);
        entry.last_used = self.clock;
        Ok(())
    }

    /// A landed upload of `key` becomes a plain device copy: the host
    /// bytes it read are released (eviction copies them back down).
    fn settle(&mut self, key: &K) -> Result<(), CudaError> {
        let Some(e) = self.entries.get_mut(key) else {
            return Ok(());
        };
        if let Some((copy, _)) = &e.upload {
            if self.memory.landed(copy)? {
                e.upload = None;
            }
        }
        Ok(())
    }

    /// Starts making `key` device-resident and returns at once: ready
    /// (its pointer-table entries), or its copy up in flight. `busy` are
    /// the checkpoints of the running batch (never evicted); `load` reads
    /// the checkpoint from disk when it has no host copy.
    pub fn prefetch(
        &mut self,
        key: &K,
        busy: &[K],
        load: impl FnOnce() -> Result<WeightImage, CudaError>,
    ) -> Result<Readiness, CudaError> {
        self.settle(key)?;
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(key) {
            if e.device.is_some() {
                e.last_used = self.clock;
                return Ok(match e.upload {
                    None => Readiness::Ready(e.entries.clone()),
                    Some(_) => Readiness::Copying,
                });
            }
        }
        let held = self.entries.get_mut(key).and_then(|e| e.host.take());
        let (pinned, placed) = match held {
            Some(pinned) => {
                let placed = self
                    .entries
                    .get(key)
                    .map(|e| e.placed.clone())
                    .unwrap_or_default();
                (pinned, placed)
            }
            None => {
                let image = load()?;
                let bytes = image.bytes.len();
                // Best effort: the loaded bytes are held only until their
                // copy lands, so a full host tier does not stop the load.
                let _ = self.make_host_room(bytes, &[busy, std::slice::from_ref(key)].concat());
                (self.memory.pin(&image.bytes)?, image.placed)
            }
        };
        let bytes = M::pinned_len(&pinned);
        let mut keep = busy.to_vec();
        keep.push(key.clone());
        if let Err(e) = self.make_device_room(bytes, &keep) {
            self.put_back_host(key, pinned, placed, bytes);
            return Err(e);
        }
        let started = self.memory.alloc(bytes).and_then(|mut buf| {
            let copy = self.memory.copy_up(&mut buf, &pinned)?;
            Ok((buf, copy))
        });
        let (buf, copy) = match started {
            Ok(started) => started,
            Err(e) => {
                self.put_back_host(key, pinned, placed, bytes);
                return Err(e);
            }
        };
        let base = self.memory.address(&buf);
        self.moves.uploads += 1;
        let entry = self
            .entries
            .entry(key.clone())
            .or_insert(Entry::empty(bytes));
        entry.bytes = bytes;
        entry.entries = placed.iter().map(|p| base + p.offset as u64).collect();
        entry.placed = placed;
        entry.device = Some(buf);
        entry.upload = Some((copy, pinned));
        entry.upload_id = self.moves.uploads;
        entry.last_used = self.clock;
        Ok(Readiness::Copying)
    }

    /// `key`'s pointer-table entries once it is device-resident and its
    /// copy has landed; `None` before.
    pub fn ready(&mut self, key: &K) -> Result<Option<Vec<u64>>, CudaError> {
        self.settle(key)?;
        Ok(self
            .entries
            .get(key)
            .filter(|e| e.settled_on_device())
            .map(|e| e.entries.clone()))
    }

    /// Makes `key` device-resident, waiting for its copy, and returns its
    /// pointer-table entries.
    pub fn ensure_device(
        &mut self,
        key: &K,
        busy: &[K],
        load: impl FnOnce() -> Result<WeightImage, CudaError>,
    ) -> Result<Vec<u64>, CudaError> {
        if let Readiness::Ready(entries) = self.prefetch(key, busy, load)? {
            return Ok(entries);
        }
        self.wait_for(key)?;
        self.ready(key)?
            .ok_or_else(|| CudaError::Layout(format!("checkpoint {key:?} left the device")))
    }

    /// Waits for `key`'s copy up, if one is in flight.
    fn wait_for(&mut self, key: &K) -> Result<(), CudaError> {
        if let Some((copy, _)) = self.entries.get(key).and_then(|e| e.upload.as_ref()) {
            self.memory.wait(copy)?;
        }
        self.settle(key)
    }

    /// Points `table` at `key` for the next batch: one small copy, none
    /// when it already points at this upload of it. Refused while `key` is
    /// not on the device or its copy is still in flight: a batch never
    /// reads a checkpoint that is still being written.
    pub fn swap_to(&mut self, table: &mut ResidentTable<K, M>, key: &K) -> Result<(), CudaError> {
        let Some(entries) = self.ready(key)? else {
            return Err(CudaError::Layout(format!(
                "checkpoint {key:?} is {:?}, not ready on the device: prefetch it and \
                 swap once its copy has landed",
                self.tier(key)
            )));
        };
        let id = self.entries.get(key).map_or(0, |e| e.upload_id);
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(key) {
            e.last_used = self.clock;
        }
        table.swap_to(&self.memory, &(key.clone(), id), &entries)
    }

    /// A failed upload leaves the host copy where it was.
    fn put_back_host(&mut self, key: &K, pinned: M::Pinned, placed: Vec<Placed>, bytes: usize) {
        let entry = self
            .entries
            .entry(key.clone())
            .or_insert(Entry::empty(bytes));
        entry.host = Some(pinned);
        entry.placed = placed;
        entry.bytes = bytes;
    }

    /// Evicts least recently used device copies not in `keep` (and not
    /// being written) until `bytes` more fit the device budget.
    fn make_device_room(&mut self, bytes: usize, keep: &[K]) -> Result<(), CudaError> {
        let budget = self.budgets.device;
        while self.device_used() + bytes > budget {
            let victim = self
                .entries
                .iter()
                .filter(|(k, e)| e.settled_on_device() && !keep.contains(k))
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            let Some(victim) = victim else {
                return Err(CudaError::Budget {
                    what: format!("checkpoint {:?}", keep.last()),
                    bytes,
                    free: budget.saturating_sub(self.device_used()),
                    budget,
                });
            };
            self.demote_to_host(&victim, keep)?;
        }
        Ok(())
    }

    /// Copies a device-resident checkpoint back to the host tier (or drops
    /// it to disk when the host budget cannot take it) and frees its
    /// device memory. A copy up in flight is waited for first.
    pub fn demote_to_host(&mut self, key: &K, keep: &[K]) -> Result<(), CudaError> {
        self.wait_for(key)?;
        let Some(e) = self.entries.get_mut(key) else {
            return Ok(());
        };
        let Some(buf) = e.device.take() else {
            return Ok(());
        };
        let bytes = e.bytes;
        e.entries.clear();
        self.moves.device_to_host += 1;
        let mut host = None;
        if bytes <= self.budgets.host && self.make_host_room(bytes, keep).is_ok() {
            host = Some(self.memory.copy_down(&buf)?);
        }
        // The device buffer is freed here, whatever the host tier took.
        drop(buf);
        match host {
            Some(data) => {
                if let Some(e) = self.entries.get_mut(key) {
                    e.host = Some(data);
                }
            }
            None => self.moves.host_to_disk += 1,
        }
        Ok(())
    }

    /// Moves least recently used host copies not in `keep` to disk until
    /// `bytes` more fit the host budget (the sources of copies in flight
    /// stay until their copies land).
    fn make_host_room(&mut self, bytes: usize, keep: &[K]) -> Result<(), CudaError> {
        let budget = self.budgets.host;
        while self.host_used() + bytes > budget {
            let victim = self
                .entries
                .iter()
                .filter(|(k, e)| e.host.is_some() && !keep.contains(k))
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            let Some(victim) = victim else {
                return Err(CudaError::Budget {
                    what: "a host copy".into(),
                    bytes,
                    free: budget.saturating_sub(self.host_used()),
                    budget,
                });
            };
            if let Some(e) = self.entries.get_mut(&victim) {
                e.host = None;
                self.moves.host_to_disk += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "residency_tests.rs"]
mod tests;
