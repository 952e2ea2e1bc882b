//! The backend's weight matrices between device memory and pinned host
//! memory: what [`crate::Backend::demote`], [`crate::Backend::prefetch`]
//! and [`crate::Backend::weight_tier`] do on a GPU.
//!
//! Each matrix keeps its slot of the weight table for its life; the slot
//! names its device copy while there is one and 0 otherwise, so a launch
//! that reads a demoted matrix faults where the sanitizer names it rather
//! than reading another's. A demotion copies the matrix down (waited for),
//! frees its device memory and keeps the bytes in pinned host memory
//! within the host budget; a prefetch allocates device memory and starts
//! the copy up on the copy stream (`copy_stream.rs`), returning at once.
//! The matrix is [`WeightTier::Uploading`] until the copy lands: its slot
//! still names nothing and [`WeightTiers::address`] refuses it, so no step
//! reads bytes still being written; the first look after the copy landed
//! points the slot at the new copy and gives the host bytes back.
//!
//! The bookkeeping is the same on a GPU and over [`super::HostMemory`],
//! whose copy stream runs only when a test says so
//! (`weight_tiers_tests.rs`).

use std::sync::{Arc, Mutex, MutexGuard};

use super::copy_stream::CopyStream;
use super::weight_table::{WeightSlot, WeightTable};
use super::CudaError;
use crate::WeightTier;

/// Where one matrix's bytes are.
enum Place<M: CopyStream> {
    Device(M::Buffer),
    /// The copy up in flight, and the host bytes it reads (kept until it
    /// lands).
    Uploading {
        buf: M::Buffer,
        copy: M::Copy,
        _src: M::Pinned,
    },
    Host(M::Pinned),
    /// Between moves (a failed move leaves the matrix where it was).
    Moving,
}

/// One weight matrix: its slot and where its bytes are. Dropped: the slot
/// is zeroed first, then the memory freed (fields drop in order), and the
/// host bytes it held leave the host tier's count.
pub struct TieredWeight<M: CopyStream> {
    slot: WeightSlot<M>,
    bytes: usize,
    place: Mutex<Place<M>>,
    host_used: Arc<Mutex<usize>>,
}

impl<M: CopyStream> Drop for TieredWeight<M> {
    fn drop(&mut self) {
        let holds = self
            .place
            .get_mut()
            .map(|p| matches!(&*p, Place::Host(_) | Place::Uploading { .. }))
            .unwrap_or(false);
        if holds {
            if let Ok(mut used) = self.host_used.lock() {
                *used = used.saturating_sub(self.bytes);
            }
        }
    }
}

impl<M: CopyStream> TieredWeight<M> {
    /// Its slot in the weight table.
    pub fn slot(&self) -> u32 {
        self.slot.index()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The matrices' tiers: the memory, the weight table their slots are in,
/// and the host tier's budget.
pub struct WeightTiers<M: CopyStream> {
    memory: M,
    table: WeightTable<M>,
    host_budget: usize,
    /// Bytes held in host memory: demoted matrices, and the sources of
    /// copies up in flight (shared with each matrix, which gives its
    /// bytes back when dropped).
    host_used: Arc<Mutex<usize>>,
}

fn poisoned() -> CudaError {
    CudaError::Driver {
        op: "weight tiers",
        detail: "a thread panicked while moving a weight".into(),
    }
}

impl<M: CopyStream> WeightTiers<M> {
    pub fn new(memory: M, table: WeightTable<M>, host_budget: usize) -> Self {
        WeightTiers {
            memory,
            table,
            host_budget,
            host_used: Arc::default(),
        }
    }

    pub fn table(&self) -> &WeightTable<M> {
        &self.table
    }

    /// Bytes held in host memory (see the field).
    pub fn host_used(&self) -> usize {
        self.host_used.lock().map_or(0, |u| *u)
    }

    fn used(&self) -> Result<MutexGuard<'_, usize>, CudaError> {
        self.host_used.lock().map_err(|_| poisoned())
    }

    /// `bytes` uploaded to device memory, with a slot naming them.
    pub fn upload(&self, bytes: &[u8]) -> Result<TieredWeight<M>, CudaError> {
        let mut buf = self.memory.alloc(bytes.len())?;
        self.memory.write(&mut buf, 0, bytes)?;
        let slot = self.table.insert(self.memory.address(&buf))?;
        Ok(TieredWeight {
            slot,
            bytes: bytes.len(),
            place: Mutex::new(Place::Device(buf)),
            host_used: Arc::clone(&self.host_used),
        })
    }

    /// `w`'s place, a landed copy up settled first: the slot then names
    /// the new device copy and the host bytes are given back.
    fn settled<'a>(&self, w: &'a TieredWeight<M>) -> Result<MutexGuard<'a, Place<M>>, CudaError> {
        let mut place = w.place.lock().map_err(|_| poisoned())?;
        let landed = match &*place {
            Place::Uploading { copy, .. } => self.memory.landed(copy)?,
            _ => false,
        };
        if landed {
            if let Place::Uploading { buf, .. } = std::mem::replace(&mut *place, Place::Moving) {
                let address = self.memory.address(&buf);
                *place = Place::Device(buf);
                let mut used = self.used()?;
                *used = used.saturating_sub(w.bytes);
                drop(used);
                w.slot.set(address)?;
            }
        }
        Ok(place)
    }

    /// The device address of `w`, refused unless it is on the device and
    /// not being written.
    pub fn address(&self, w: &TieredWeight<M>) -> Result<u64, CudaError> {
        match &*self.settled(w)? {
            Place::Device(buf) => Ok(self.memory.address(buf)),
            Place::Uploading { .. } => Err(not_resident("still being copied up")),
            Place::Host(_) | Place::Moving => Err(not_resident("in host memory")),
        }
    }

    /// Where `weights` are: the slowest of them.
    pub fn tier(&self, weights: &[&TieredWeight<M>]) -> Result<WeightTier, CudaError> {
        let mut tier = WeightTier::Resident;
        for w in weights {
            match &*self.settled(w)? {
                Place::Device(_) => {}
                Place::Uploading { .. } => {
                    if tier == WeightTier::Resident {
                        tier = WeightTier::Uploading;
                    }
                }
                Place::Host(_) | Place::Moving => tier = WeightTier::Host,
            }
        }
        Ok(tier)
    }

    /// Moves `weights` to host memory (see the module documentation):
    /// `false` and nothing moved when the host budget cannot take the
    /// ones on the device.
    pub fn demote(&self, weights: &[&TieredWeight<M>]) -> Result<bool, CudaError> {
        // Copies up in flight land first: their bytes are then on both sides.
        for w in weights {
            let place = w.place.lock().map_err(|_| poisoned())?;
            if let Place::Uploading { copy, .. } = &*place {
                self.memory.wait(copy)?;
            }
        }
        let mut moving = 0usize;
        for w in weights {
            if matches!(&*self.settled(w)?, Place::Device(_)) {
                moving += w.bytes;
            }
        }
        {
            let mut used = self.used()?;
            if *used + moving > self.host_budget {
                return Ok(false);
            }
            *used += moving;
        }
        for w in weights {
            let mut place = w.place.lock().map_err(|_| poisoned())?;
            let buf = match std::mem::replace(&mut *place, Place::Moving) {
                Place::Device(buf) => buf,
                other => {
                    *place = other; // not on the device: stays
                    continue;
                }
            };
            match self.memory.copy_down(&buf) {
                Ok(host) => {
                    // The slot names nothing before the memory is freed.
                    w.slot.set(0)?;
                    drop(buf);
                    *place = Place::Host(host);
                }
                Err(e) => {
                    *place = Place::Device(buf);
                    let mut used = self.used()?;
                    *used = used.saturating_sub(w.bytes);
                    return Err(e);
                }
            }
        }
        Ok(true)
    }

    /// Starts the copy up of every one of `weights` in host memory and
    /// returns their tier (see the module documentation).
    pub fn prefetch(&self, weights: &[&TieredWeight<M>]) -> Result<WeightTier, CudaError> {
        for w in weights {
            let mut place = w.place.lock().map_err(|_| poisoned())?;
            let src = match std::mem::replace(&mut *place, Place::Moving) {
                Place::Host(src) => src,
                other => {
                    *place = other; // on the device or on its way
                    continue;
                }
            };
            let started = self.memory.alloc(w.bytes).and_then(|mut buf| {
                let copy = self.memory.copy_up(&mut buf, &src)?;
                Ok((buf, copy))
            });
            match started {
                Ok((buf, copy)) => {
                    *place = Place::Uploading {
                        buf,
                        copy,
                        _src: src,
                    }
                }
                Err(e) => {
                    *place = Place::Host(src);
                    return Err(e);
                }
            }
        }
        self.tier(weights)
    }

    /// Waits for the copies up of `weights` in flight.
    pub fn wait(&self, weights: &[&TieredWeight<M>]) -> Result<(), CudaError> {
        for w in weights {
            let place = w.place.lock().map_err(|_| poisoned())?;
            if let Place::Uploading { copy, .. } = &*place {
                self.memory.wait(copy)?;
            }
        }
        self.tier(weights).map(|_| ())
    }
}

fn not_resident(why: &str) -> CudaError {
    CudaError::Layout(format!(
        "a weight matrix is {why}, not on the device: the engine prefetches a checkpoint and \
         runs it once its copy has landed"
    ))
}

#[cfg(test)]
#[path = "weight_tiers_tests.rs"]
mod tests;
