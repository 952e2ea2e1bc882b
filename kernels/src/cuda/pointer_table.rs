//! The device-resident weight pointer table: one u64 address per weight
//! slot, read by every kernel (`sy_weights.cuh`). Kernels and captured CUDA
//! graphs hold the table's address and slot numbers, never a weight's
//! address, so swapping the checkpoint of the next batch is one copy of
//! `8 · slots` bytes into the same buffer, and a captured decode step stays
//! valid across swaps.

use super::memory::DeviceMemory;
use super::CudaError;

/// The table on the device, and which checkpoint it points at now.
pub struct PointerTable<K, M: DeviceMemory> {
    buf: M::Buffer,
    slots: usize,
    active: Option<K>,
    swaps: u64,
}

impl<K: PartialEq + Clone, M: DeviceMemory> PointerTable<K, M> {
    /// A table of `slots` entries, all 0 until the first swap.
    pub fn new(memory: &M, slots: usize) -> Result<Self, CudaError> {
        Ok(PointerTable {
            buf: memory.alloc(slots.max(1) * 8)?,
            slots,
            active: None,
            swaps: 0,
        })
    }

    /// The table's device address: what kernels and graphs capture. It
    /// never changes.
    pub fn address(&self, memory: &M) -> u64 {
        memory.address(&self.buf)
    }

    /// Points the table at `checkpoint`, whose weights lie at `entries`
    /// (one per slot, from `WeightImage::table_entries`): one copy, none
    /// when it is already the active one.
    pub fn swap_to(
        &mut self,
        memory: &M,
        checkpoint: &K,
        entries: &[u64],
    ) -> Result<(), CudaError> {
        if entries.len() != self.slots {
            return Err(CudaError::Layout(format!(
                "a pointer table of {} slots given {} addresses",
                self.slots,
                entries.len()
            )));
        }
        if self.active.as_ref() == Some(checkpoint) {
            return Ok(());
        }
        let bytes: Vec<u8> = entries.iter().flat_map(|a| a.to_le_bytes()).collect();
        memory.write(&mut self.buf, 0, &bytes)?;
        self.active = Some(checkpoint.clone());
        self.swaps += 1;
        Ok(())
    }

    /// Forgets the active checkpoint (its weights moved or were freed), so
    /// the next swap to it copies again.
    pub fn invalidate(&mut self) {
        self.active = None;
    }

    pub fn active(&self) -> Option<&K> {
        self.active.as_ref()
    }

    /// Table copies made so far.
    pub fn swaps(&self) -> u64 {
        self.swaps
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::HostMemory;
    use super::super::upload::{SlotLayout, WeightImage};
    use super::*;
    use crate::{DType, WeightView};

    fn image(layout: &SlotLayout, fill: u8) -> WeightImage {
        let t = |f: u8| WeightView::new(DType::Q8_0, 2, 32, vec![f; 68].into()).unwrap();
        WeightImage::pack(layout, vec![("a", t(fill)), ("b", t(fill + 1))]).unwrap()
    }

    /// As a kernel does: the slot's address from the table, then the bytes there.
    fn follow(mem: &HostMemory, table: u64, slot: u64) -> Vec<u8> {
        let entry = mem.read_at(table + 8 * slot, 8).unwrap();
        let address = u64::from_le_bytes(entry.try_into().unwrap());
        mem.read_at(address, 68).unwrap()
    }

    #[test]
    fn a_swap_repoints_every_slot_and_keeps_the_table_address() {
        let mem = HostMemory::new(1 << 20);
        let layout = SlotLayout::new(vec!["a".into(), "b".into()]).unwrap();
        let mut uploaded = Vec::new();
        for (id, fill) in [(1u32, 10u8), (2, 20)] {
            let img = image(&layout, fill);
            let mut buf = mem.alloc(img.bytes.len()).unwrap();
            mem.write(&mut buf, 0, &img.bytes).unwrap();
            let entries = img.table_entries(mem.address(&buf));
            uploaded.push((id, buf, entries));
        }
        let mut table = PointerTable::<u32, _>::new(&mem, 2).unwrap();
        let address = table.address(&mem);
        for round in 0..3 {
            for (id, _, entries) in &uploaded {
                table.swap_to(&mem, id, entries).unwrap();
                let fill = if *id == 1 { 10 } else { 20 };
                assert_eq!(follow(&mem, address, 0), vec![fill; 68], "round {round}");
                assert_eq!(follow(&mem, address, 1), vec![fill + 1; 68]);
            }
        }
        assert_eq!(table.address(&mem), address);
        assert_eq!(table.swaps(), 6);
        // Swapping to the active checkpoint copies nothing.
        table.swap_to(&mem, &2, &uploaded[1].2).unwrap();
        assert_eq!(table.swaps(), 6);
        table.invalidate();
        table.swap_to(&mem, &2, &uploaded[1].2).unwrap();
        assert_eq!(table.swaps(), 7);
        assert!(table.swap_to(&mem, &1, &[0]).is_err());
    }
}
