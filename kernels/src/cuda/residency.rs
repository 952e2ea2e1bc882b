//! Where each checkpoint's weights are: device memory within a byte
//! budget, else host memory (pinned on a GPU, so the copy up overlaps the
//! running batch) within its own budget, else only on disk. Making a
//! checkpoint device-resident evicts the least recently used ones that the
//! running batch does not need, device to host and host to disk.
//!
//! This is bookkeeping over [`DeviceMemory`], the same on a GPU and on the
//! host stand-in; the registry and routing read [`Residency::tier`].

use std::collections::HashMap;
use std::hash::Hash;

use super::memory::DeviceMemory;
use super::upload::{Placed, WeightImage};
use super::CudaError;

/// A checkpoint's fastest copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Device,
    Host,
    Disk,
}

struct Entry<B> {
    /// Where the tensors lie in the image (the same in every tier).
    placed: Vec<Placed>,
    bytes: usize,
    device: Option<B>,
    host: Option<Vec<u8>>,
    /// The pointer-table entries of the device copy.
    entries: Vec<u64>,
    last_used: u64,
}

/// Byte budgets of the two memory tiers.
#[derive(Clone, Copy, Debug)]
pub struct Budgets {
    pub device: usize,
    pub host: usize,
}

pub struct Residency<K, M: DeviceMemory> {
    memory: M,
    budgets: Budgets,
    entries: HashMap<K, Entry<M::Buffer>>,
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

impl<K: Eq + Hash + Clone + std::fmt::Debug, M: DeviceMemory> Residency<K, M> {
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

    pub fn tier(&self, key: &K) -> Tier {
        match self.entries.get(key) {
            Some(e) if e.device.is_some() => Tier::Device,
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

    pub fn host_used(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.host.is_some())
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
        self.clock += 1;
        let entry = self.entries.entry(key).or_insert(Entry {
            placed: Vec::new(),
            bytes,
            device: None,
            host: None,
            entries: Vec::new(),
            last_used: 0,
        });
        entry.bytes = bytes;
        entry.placed = image.placed;
        entry.host = Some(image.bytes);
        entry.last_used = self.clock;
        Ok(())
    }

    /// Makes `key` device-resident and returns its pointer-table entries.
    /// `busy` are the checkpoints of the running batch (never evicted);
    /// `load` reads the checkpoint from disk when it has no host copy.
    pub fn ensure_device(
        &mut self,
        key: &K,
        busy: &[K],
        load: impl FnOnce() -> Result<WeightImage, CudaError>,
    ) -> Result<Vec<u64>, CudaError> {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(key) {
            if e.device.is_some() {
                e.last_used = self.clock;
                return Ok(e.entries.clone());
            }
        }
        let held = self.entries.get_mut(key).and_then(|e| {
            let bytes = e.host.take()?;
            Some(WeightImage {
                bytes,
                placed: e.placed.clone(),
            })
        });
        let image = match held {
            Some(image) => image,
            None => load()?,
        };
        let bytes = image.bytes.len();
        let mut keep = busy.to_vec();
        keep.push(key.clone());
        if let Err(e) = self.make_device_room(bytes, &keep) {
            self.put_back_host(key, image);
            return Err(e);
        }
        let upload = self.memory.alloc(bytes).and_then(|mut buf| {
            self.memory.write(&mut buf, 0, &image.bytes)?;
            Ok(buf)
        });
        let buf = match upload {
            Ok(buf) => buf,
            Err(e) => {
                self.put_back_host(key, image);
                return Err(e);
            }
        };
        let entries = image.table_entries(self.memory.address(&buf));
        self.moves.uploads += 1;
        // The device copy stands in for the host one (whose bytes drop
        // here); eviction copies it back to the host tier.
        let entry = self.entries.entry(key.clone()).or_insert(Entry {
            placed: Vec::new(),
            bytes,
            device: None,
            host: None,
            entries: Vec::new(),
            last_used: 0,
        });
        entry.bytes = bytes;
        entry.placed = image.placed;
        entry.device = Some(buf);
        entry.entries = entries.clone();
        entry.last_used = self.clock;
        Ok(entries)
    }

    /// A failed upload leaves a held host copy where it was.
    fn put_back_host(&mut self, key: &K, image: WeightImage) {
        if let Some(e) = self.entries.get_mut(key) {
            e.host = Some(image.bytes);
        }
    }

    /// Evicts least recently used device copies not in `keep` until
    /// `bytes` more fit the device budget.
    fn make_device_room(&mut self, bytes: usize, keep: &[K]) -> Result<(), CudaError> {
        let budget = self.budgets.device;
        while self.device_used() + bytes > budget {
            let victim = self
                .entries
                .iter()
                .filter(|(k, e)| e.device.is_some() && !keep.contains(k))
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
    /// device memory.
    pub fn demote_to_host(&mut self, key: &K, keep: &[K]) -> Result<(), CudaError> {
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
            let mut data = vec![0u8; bytes];
            self.memory.read(&buf, 0, &mut data)?;
            host = Some(data);
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
    /// `bytes` more fit the host budget.
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
mod tests {
    use super::super::memory::HostMemory;
    use super::super::upload::SlotLayout;
    use super::*;
    use crate::{DType, WeightView};

    /// A one-tensor checkpoint of `kib` KiB filled with `fill`.
    fn image(kib: usize, fill: u8) -> WeightImage {
        let layout = SlotLayout::new(vec!["w".into()]).unwrap();
        let view = WeightView::new(
            DType::Q8_0,
            kib * 1024 / 34,
            32,
            vec![fill; kib * 1024 / 34 * 34].into(),
        )
        .unwrap();
        WeightImage::pack(&layout, vec![("w", view)]).unwrap()
    }

    fn residency(device_kib: usize, host_kib: usize) -> Residency<&'static str, HostMemory> {
        let budgets = Budgets {
            device: device_kib * 1024,
            host: host_kib * 1024,
        };
        // The stand-in device is bigger than the budget: the budget, not
        // the memory, is what is tested.
        Residency::new(HostMemory::new(1 << 24), budgets)
    }

    fn never() -> Result<WeightImage, CudaError> {
        Err(CudaError::Layout("loaded from disk unexpectedly".into()))
    }

    #[test]
    fn least_recently_used_checkpoints_move_down_a_tier() {
        let mut r = residency(20, 20);
        for (k, fill) in [("a", 1), ("b", 2), ("c", 3)] {
            r.insert_host(k, image(8, fill)).unwrap();
        }
        // Three of 8 KiB exceed the 20 KiB host budget: `a` went to disk.
        assert_eq!(r.tier(&"a"), Tier::Disk);
        assert_eq!(r.tier(&"b"), Tier::Host);
        let b = r.ensure_device(&"b", &[], never).unwrap();
        let c = r.ensure_device(&"c", &[], never).unwrap();
        assert_eq!((r.tier(&"b"), r.tier(&"c")), (Tier::Device, Tier::Device));
        assert_eq!(r.device_used(), 2 * image(8, 0).bytes.len());
        // The device copies hold the checkpoints' bytes where the table says.
        let mem = r.memory().clone();
        assert_eq!(mem.read_at(b[0], 4), Some(vec![2; 4]));
        assert_eq!(mem.read_at(c[0], 4), Some(vec![3; 4]));
        // `a` comes from disk; `b` is the least recently used, `c` busy.
        let a = r.ensure_device(&"a", &["c"], || Ok(image(8, 1))).unwrap();
        assert_eq!(r.tier(&"b"), Tier::Host, "evicted to pinned host memory");
        assert_eq!(r.tier(&"c"), Tier::Device);
        assert_eq!(mem.read_at(a[0], 4), Some(vec![1; 4]));
        // `b` comes back from its host copy, with its bytes intact.
        let b = r.ensure_device(&"b", &["a"], never).unwrap();
        assert_eq!(mem.read_at(b[0], 4), Some(vec![2; 4]));
        assert_eq!(r.tier(&"c"), Tier::Host);
        assert_eq!(r.moves().uploads, 4);
        assert_eq!(r.moves().device_to_host, 2);
        // A resident checkpoint costs no copy.
        assert_eq!(r.ensure_device(&"b", &[], never).unwrap(), b);
        assert_eq!(r.moves().uploads, 4);
    }

    #[test]
    fn a_checkpoint_that_cannot_fit_is_an_error_and_keeps_its_host_copy() {
        let mut r = residency(10, 100);
        r.insert_host("a", image(8, 1)).unwrap();
        r.insert_host("b", image(8, 2)).unwrap();
        r.ensure_device(&"a", &[], never).unwrap();
        // `a` is busy, so `b` has no room.
        let err = r.ensure_device(&"b", &["a"], never).unwrap_err();
        assert!(
            matches!(err, CudaError::Budget { budget: 10240, .. }),
            "{err}"
        );
        assert_eq!(r.tier(&"b"), Tier::Host);
        // Bigger than the whole budget: never fits.
        r.insert_host("big", image(12, 3)).unwrap();
        assert!(r.ensure_device(&"big", &[], never).is_err());
        assert_eq!(r.tier(&"big"), Tier::Host);
    }

    #[test]
    fn eviction_without_host_room_goes_to_disk() {
        let mut r = residency(10, 0);
        r.ensure_device(&"a", &[], || Ok(image(8, 1))).unwrap();
        r.ensure_device(&"b", &[], || Ok(image(8, 2))).unwrap();
        assert_eq!(r.tier(&"a"), Tier::Disk);
        assert_eq!(r.moves().host_to_disk, 1);
        // The freed device memory went back to the device.
        assert_eq!(r.memory().used(), image(8, 0).bytes.len());
    }
}
