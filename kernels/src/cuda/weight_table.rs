//! The backend's weight table: one device array of addresses with a slot
//! per uploaded matrix, which every matmul and embedding kernel reads its
//! weights through (`sy_weights.cuh`).
//!
//! A matrix keeps its slot for its life ([`WeightSlot`]); dropping it
//! frees the slot and zeroes the entry, so a stale launch reads address 0
//! (a fault the sanitizer names) rather than another matrix. The table's
//! address never changes: its capacity is fixed when the backend opens.
//! Swapping a whole checkpoint under a captured graph is the
//! [`super::PointerTable`]'s job; this table is where matrices live
//! between swaps.

use std::sync::{Arc, Mutex};

use super::memory::DeviceMemory;
use super::CudaError;

/// Slots unless configured: 8 bytes each, so 512 KiB of device memory,
/// enough for a few hundred checkpoints of a few hundred matrices.
pub const DEFAULT_SLOTS: usize = 1 << 16;

struct State<M: DeviceMemory> {
    buf: M::Buffer,
    free: Vec<u32>,
    next: u32,
}

struct Shared<M: DeviceMemory> {
    memory: M,
    capacity: u32,
    /// Slot bookkeeping and the entries' writes, under one lock.
    state: Mutex<State<M>>,
}

/// The table; cloning shares it.
pub struct WeightTable<M: DeviceMemory> {
    shared: Arc<Shared<M>>,
    address: u64,
}

impl<M: DeviceMemory> Clone for WeightTable<M> {
    fn clone(&self) -> Self {
        WeightTable {
            shared: Arc::clone(&self.shared),
            address: self.address,
        }
    }
}

/// One matrix's slot; dropping it frees the slot.
pub struct WeightSlot<M: DeviceMemory> {
    slot: u32,
    shared: Arc<Shared<M>>,
}

impl<M: DeviceMemory> WeightSlot<M> {
    /// The slot number kernels are given.
    pub fn index(&self) -> u32 {
        self.slot
    }

    /// Points the slot at `address` (0: at nothing, a weight that left
    /// the device), in stream order with the launches that read it.
    pub fn set(&self, address: u64) -> Result<(), CudaError> {
        let mut state = self.shared.state.lock().map_err(|_| poisoned())?;
        self.shared.memory.write(
            &mut state.buf,
            8 * self.slot as usize,
            &address.to_le_bytes(),
        )
    }
}

impl<M: DeviceMemory> Drop for WeightSlot<M> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.shared.state.lock() {
            // A failed write leaves a dangling entry nobody reads (the
            // slot is free until reused, and reuse rewrites it).
            let _ = self
                .shared
                .memory
                .write(&mut state.buf, 8 * self.slot as usize, &[0; 8]);
            state.free.push(self.slot);
        }
    }
}

impl<M: DeviceMemory> WeightTable<M> {
    /// A table of `capacity` slots, all 0.
    pub fn new(memory: M, capacity: usize) -> Result<Self, CudaError> {
        let capacity = u32::try_from(capacity.max(1))
            .map_err(|_| CudaError::Layout(format!("a weight table of {capacity} slots")))?;
        let buf = memory.alloc(8 * capacity as usize)?;
        let address = memory.address(&buf);
        Ok(WeightTable {
            shared: Arc::new(Shared {
                memory,
                capacity,
                state: Mutex::new(State {
                    buf,
                    free: Vec::new(),
                    next: 0,
                }),
            }),
            address,
        })
    }

    /// The table's device address, what every launch is given.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// A slot holding `address`.
    pub fn insert(&self, address: u64) -> Result<WeightSlot<M>, CudaError> {
        let shared = &self.shared;
        let mut state = shared.state.lock().map_err(|_| poisoned())?;
        let slot = match state.free.pop() {
            Some(slot) => slot,
            None if state.next < shared.capacity => {
                state.next += 1;
                state.next - 1
            }
            None => {
                return Err(CudaError::Layout(format!(
                    "the weight table's {} slots are all taken: too many matrices loaded",
                    shared.capacity
                )))
            }
        };
        let written =
            shared
                .memory
                .write(&mut state.buf, 8 * slot as usize, &address.to_le_bytes());
        if let Err(e) = written {
            state.free.push(slot);
            return Err(e);
        }
        Ok(WeightSlot {
            slot,
            shared: Arc::clone(shared),
        })
    }

    /// Slots in use.
    pub fn used(&self) -> usize {
        self.shared
            .state
            .lock()
            .map(|s| s.next as usize - s.free.len())
            .unwrap_or(0)
    }
}

fn poisoned() -> CudaError {
    CudaError::Driver {
        op: "weight table",
        detail: "a thread panicked while holding the table".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::HostMemory;
    use super::*;

    /// As a kernel does: the slot's entry, then the bytes it points at.
    fn follow(mem: &HostMemory, table: &WeightTable<HostMemory>, slot: u32, len: usize) -> Vec<u8> {
        let entry = mem.read_at(table.address() + 8 * slot as u64, 8).unwrap();
        let address = u64::from_le_bytes(entry.try_into().unwrap());
        mem.read_at(address, len).unwrap_or_default()
    }

    #[test]
    fn slots_point_at_their_matrix_and_are_reused_after_drop() {
        let mem = HostMemory::new(1 << 20);
        let table = WeightTable::new(mem.clone(), 3).unwrap();
        let mut bufs = Vec::new();
        let mut slots = Vec::new();
        for fill in [1u8, 2, 3] {
            let mut buf = mem.alloc(16).unwrap();
            mem.write(&mut buf, 0, &[fill; 16]).unwrap();
            slots.push(table.insert(mem.address(&buf)).unwrap());
            bufs.push(buf);
        }
        for (i, slot) in slots.iter().enumerate() {
            assert_eq!(
                follow(&mem, &table, slot.index(), 16),
                vec![i as u8 + 1; 16]
            );
        }
        let err = table.insert(0x1000).err().unwrap().to_string();
        assert!(err.contains("3 slots are all taken"), "{err}");
        assert_eq!(table.used(), 3);
        // A freed slot is zeroed, then reused for the next matrix.
        let freed = slots.remove(1).index();
        assert_eq!(table.used(), 2);
        let entry = mem.read_at(table.address() + 8 * freed as u64, 8).unwrap();
        assert_eq!(entry, vec![0; 8]);
        let again = table.insert(mem.address(&bufs[2])).unwrap();
        assert_eq!(again.index(), freed);
        assert_eq!(follow(&mem, &table, freed, 16), vec![3; 16]);
    }
}
