//! Weight matrices moved between device and host memory over the host
//! stand-in, whose copy stream runs only when a test says so: a matrix
//! that is copying up gives no address and its slot names nothing, so a
//! step that read it too early would be refused, not served stale bytes.

use super::*;
use crate::cuda::memory::{DeviceMemory, HostMemory};

const BYTES: usize = 32;

fn setup(host_budget: usize) -> (HostMemory, WeightTiers<HostMemory>) {
    let mem = HostMemory::new(1 << 16);
    let table = WeightTable::new(mem.clone(), 8).expect("the stand-in holds a table of slots");
    let tiers = WeightTiers::new(mem.clone(), table, host_budget);
    (mem, tiers)
}

/// What a kernel reads through `w`'s slot: its entry, then the bytes
/// there (`None`: the entry names nothing).
fn follow(
    mem: &HostMemory,
    tiers: &WeightTiers<HostMemory>,
    w: &TieredWeight<HostMemory>,
) -> Option<Vec<u8>> {
    let at = tiers.table().address() + 8 * u64::from(w.slot());
    let entry = u64::from_le_bytes(
        mem.read_at(at, 8)
            .expect("the slot lies in the stand-in\'s memory")
            .try_into()
            .expect("an entry is eight bytes"),
    );
    (entry != 0).then(|| {
        mem.read_at(entry, BYTES)
            .expect("the entry names a matrix in the stand-in")
    })
}

#[test]
fn a_demoted_matrix_leaves_device_memory_within_the_host_budget() {
    let (mem, tiers) = setup(2 * BYTES);
    let ws: Vec<_> = (1..=3u8)
        .map(|fill| {
            tiers
                .upload(&[fill; BYTES])
                .expect("the stand-in has room for the matrix")
        })
        .collect();
    let device_before = mem.used();
    assert_eq!(
        tiers
            .tier(&[&ws[0], &ws[1]])
            .expect("the matrices are the tiers\' own"),
        WeightTier::Resident
    );
    assert!(tiers
        .demote(&[&ws[0], &ws[1]])
        .expect("a demotion of the tiers\' own matrices"));
    assert_eq!(mem.used(), device_before - 2 * BYTES, "device memory freed");
    assert_eq!(tiers.host_used(), 2 * BYTES);
    assert_eq!(
        tiers
            .tier(&[&ws[0]])
            .expect("the matrices are the tiers\' own"),
        WeightTier::Host
    );
    // Mixed: the slowest counts.
    assert_eq!(
        tiers
            .tier(&[&ws[2], &ws[1]])
            .expect("the matrices are the tiers\' own"),
        WeightTier::Host
    );
    assert_eq!(follow(&mem, &tiers, &ws[0]), None, "the slot names nothing");
    assert!(tiers.address(&ws[0]).is_err());
    // The host budget is full: the third stays on the device, and the
    // caller drops it to disk instead.
    assert!(!tiers
        .demote(&[&ws[2]])
        .expect("a demotion of the tiers\' own matrices"));
    assert_eq!(
        tiers
            .tier(&[&ws[2]])
            .expect("the matrices are the tiers\' own"),
        WeightTier::Resident
    );
    assert_eq!(follow(&mem, &tiers, &ws[2]), Some(vec![3; BYTES]));
    // Dropping a demoted matrix gives its host bytes back.
    let mut ws = ws;
    drop(ws.remove(0));
    assert_eq!(tiers.host_used(), BYTES);
    assert!(tiers
        .demote(&[&ws[1]])
        .expect("a demotion of the tiers\' own matrices"));
}

#[test]
fn a_prefetched_matrix_is_refused_until_its_copy_lands() {
    let (mem, tiers) = setup(4 * BYTES);
    let a = tiers
        .upload(&[7; BYTES])
        .expect("the stand-in has room for the matrix");
    let b = tiers
        .upload(&[9; BYTES])
        .expect("the stand-in has room for the matrix");
    assert!(tiers
        .demote(&[&a, &b])
        .expect("a demotion of the tiers\' own matrices"));
    let device_before = mem.used();
    assert_eq!(
        tiers
            .prefetch(&[&a, &b])
            .expect("a prefetch of the tiers\' own matrices"),
        WeightTier::Uploading
    );
    assert_eq!(mem.used(), device_before + 2 * BYTES, "device memory taken");
    assert_eq!(mem.pending_copies(), 2, "returned before the copies ran");
    // In flight: no address, the slot still names nothing.
    assert!(tiers.address(&a).is_err());
    assert_eq!(follow(&mem, &tiers, &a), None);
    assert_eq!(tiers.host_used(), 2 * BYTES, "sources held while copying");
    // One copy lands: that matrix is ready, the pair is not.
    assert_eq!(mem.run_copies(1), 1);
    assert_eq!(
        tiers.tier(&[&a]).expect("the matrices are the tiers\' own"),
        WeightTier::Resident
    );
    assert_eq!(
        tiers
            .tier(&[&a, &b])
            .expect("the matrices are the tiers\' own"),
        WeightTier::Uploading
    );
    assert_eq!(follow(&mem, &tiers, &a), Some(vec![7; BYTES]));
    assert_eq!(tiers.host_used(), BYTES);
    tiers
        .wait(&[&a, &b])
        .expect("the copy stream finishes its copies");
    assert_eq!(
        tiers
            .tier(&[&a, &b])
            .expect("the matrices are the tiers\' own"),
        WeightTier::Resident
    );
    assert_eq!(follow(&mem, &tiers, &b), Some(vec![9; BYTES]));
    assert_eq!(tiers.address(&b).ok(), follow_address(&mem, &tiers, &b));
    assert_eq!(tiers.host_used(), 0);
    // Prefetching what is on the device does nothing.
    assert_eq!(
        tiers
            .prefetch(&[&a])
            .expect("a prefetch of the tiers\' own matrices"),
        WeightTier::Resident
    );
    assert_eq!(mem.pending_copies(), 0);
}

fn follow_address(
    mem: &HostMemory,
    tiers: &WeightTiers<HostMemory>,
    w: &TieredWeight<HostMemory>,
) -> Option<u64> {
    let at = tiers.table().address() + 8 * u64::from(w.slot());
    Some(u64::from_le_bytes(mem.read_at(at, 8)?.try_into().ok()?))
}

#[test]
fn a_demotion_waits_for_a_copy_in_flight_and_keeps_the_bytes() {
    let (mem, tiers) = setup(BYTES);
    let a = tiers
        .upload(&[5; BYTES])
        .expect("the stand-in has room for the matrix");
    assert!(tiers
        .demote(&[&a])
        .expect("a demotion of the tiers\' own matrices"));
    tiers
        .prefetch(&[&a])
        .expect("a prefetch of the tiers\' own matrices");
    // Down again before the copy up ran: it lands first, then moves down.
    assert!(tiers
        .demote(&[&a])
        .expect("a demotion of the tiers\' own matrices"));
    assert_eq!(mem.pending_copies(), 0);
    assert_eq!(
        tiers.tier(&[&a]).expect("the matrices are the tiers\' own"),
        WeightTier::Host
    );
    assert_eq!(tiers.host_used(), BYTES);
    tiers
        .prefetch(&[&a])
        .expect("a prefetch of the tiers\' own matrices");
    tiers
        .wait(&[&a])
        .expect("the copy stream finishes its copies");
    assert_eq!(follow(&mem, &tiers, &a), Some(vec![5; BYTES]));
}

#[test]
fn a_prefetch_the_device_refuses_leaves_the_matrix_in_host_memory() {
    let mem = HostMemory::new(3 * BYTES + 64);
    let table = WeightTable::new(mem.clone(), 1).expect("the stand-in holds a table of slots");
    let tiers = WeightTiers::new(mem.clone(), table, BYTES);
    let a = tiers
        .upload(&[4; BYTES])
        .expect("the stand-in has room for the matrix");
    assert!(tiers
        .demote(&[&a])
        .expect("a demotion of the tiers\' own matrices"));
    // Something else takes the device memory meanwhile.
    let _hog = mem
        .alloc(mem.free_bytes())
        .expect("the stand-in gives what is free");
    assert!(tiers.prefetch(&[&a]).is_err());
    assert_eq!(
        tiers.tier(&[&a]).expect("the matrices are the tiers\' own"),
        WeightTier::Host
    );
    assert_eq!(tiers.host_used(), BYTES);
}
