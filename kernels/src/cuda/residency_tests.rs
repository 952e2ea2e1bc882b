//! The residency tiers on the host stand-in: budgets, eviction order,
//! moves down and up, and copies up that land only when the copy stream
//! runs them (`HostMemory::run_copies`), as on a GPU.

use super::super::memory::HostMemory;
use super::super::upload::SlotLayout;
use super::*;
use crate::{DType, WeightView};

/// A one-tensor checkpoint of `kib` KiB filled with `fill`.
fn image(kib: usize, fill: u8) -> WeightImage {
    let layout = SlotLayout::new(vec!["w".into()]).expect("one named slot");
    let view = WeightView::new(
        DType::Q8_0,
        kib * 1024 / 34,
        32,
        vec![fill; kib * 1024 / 34 * 34].into(),
    )
    .expect("whole Q8_0 blocks of 32 columns");
    WeightImage::pack(&layout, vec![("w", view)]).expect("the tensor the layout names")
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

/// As a kernel does: slot 0 of the table, then 4 bytes where it points.
fn follow(mem: &HostMemory, table: &ResidentTable<&'static str, HostMemory>) -> Vec<u8> {
    let entry = mem
        .read_at(table.address(mem), 8)
        .expect("the table's first slot is in memory");
    let address = u64::from_le_bytes(entry.try_into().expect("a slot is 8 bytes"));
    mem.read_at(address, 4).unwrap_or_default()
}

#[test]
fn least_recently_used_checkpoints_move_down_a_tier() {
    let mut r = residency(20, 20);
    for (k, fill) in [("a", 1), ("b", 2), ("c", 3)] {
        r.insert_host(k, image(8, fill))
            .expect("within the host budget");
    }
    // Three of 8 KiB exceed the 20 KiB host budget: `a` went to disk.
    assert_eq!(r.tier(&"a"), Tier::Disk);
    assert_eq!(r.tier(&"b"), Tier::Host);
    let b = r
        .ensure_device(&"b", &[], never)
        .expect("a resident or loadable checkpoint");
    let c = r
        .ensure_device(&"c", &[], never)
        .expect("a resident or loadable checkpoint");
    assert_eq!((r.tier(&"b"), r.tier(&"c")), (Tier::Device, Tier::Device));
    assert_eq!(r.device_used(), 2 * image(8, 0).bytes.len());
    // The device copies hold the checkpoints' bytes where the table says.
    let mem = r.memory().clone();
    assert_eq!(mem.read_at(b[0], 4), Some(vec![2; 4]));
    assert_eq!(mem.read_at(c[0], 4), Some(vec![3; 4]));
    // `a` comes from disk; `b` is the least recently used, `c` busy.
    let a = r
        .ensure_device(&"a", &["c"], || Ok(image(8, 1)))
        .expect("a resident or loadable checkpoint");
    assert_eq!(r.tier(&"b"), Tier::Host, "evicted to pinned host memory");
    assert_eq!(r.tier(&"c"), Tier::Device);
    assert_eq!(mem.read_at(a[0], 4), Some(vec![1; 4]));
    // `b` comes back from its host copy, with its bytes intact.
    let b = r
        .ensure_device(&"b", &["a"], never)
        .expect("a resident or loadable checkpoint");
    assert_eq!(mem.read_at(b[0], 4), Some(vec![2; 4]));
    assert_eq!(r.tier(&"c"), Tier::Host);
    assert_eq!(r.moves().uploads, 4);
    assert_eq!(r.moves().device_to_host, 2);
    // A resident checkpoint costs no copy.
    assert_eq!(
        r.ensure_device(&"b", &[], never)
            .expect("a resident or loadable checkpoint"),
        b
    );
    assert_eq!(r.moves().uploads, 4);
}

#[test]
fn a_checkpoint_that_cannot_fit_is_an_error_and_keeps_its_host_copy() {
    let mut r = residency(10, 100);
    r.insert_host("a", image(8, 1))
        .expect("within the host budget");
    r.insert_host("b", image(8, 2))
        .expect("within the host budget");
    r.ensure_device(&"a", &[], never)
        .expect("a resident or loadable checkpoint");
    // `a` is busy, so `b` has no room.
    let err = r.ensure_device(&"b", &["a"], never).unwrap_err();
    assert!(
        matches!(err, CudaError::Budget { budget: 10240, .. }),
        "{err}"
    );
    assert_eq!(r.tier(&"b"), Tier::Host);
    // Bigger than the whole budget: never fits.
    r.insert_host("big", image(12, 3))
        .expect("within the host budget");
    assert!(r.ensure_device(&"big", &[], never).is_err());
    assert_eq!(r.tier(&"big"), Tier::Host);
}

#[test]
fn eviction_without_host_room_goes_to_disk() {
    let mut r = residency(10, 0);
    r.ensure_device(&"a", &[], || Ok(image(8, 1)))
        .expect("a resident or loadable checkpoint");
    r.ensure_device(&"b", &[], || Ok(image(8, 2)))
        .expect("a resident or loadable checkpoint");
    assert_eq!(r.tier(&"a"), Tier::Disk);
    assert_eq!(r.moves().host_to_disk, 1);
    // The freed device memory went back to the device.
    assert_eq!(r.memory().used(), image(8, 0).bytes.len());
}

/// The next batch's checkpoint is copied up on the copy stream while the
/// table still points at the running one; the table is swapped to it only
/// once its copy has landed.
#[test]
fn the_next_checkpoint_copies_up_beside_the_batch_and_is_swapped_in_once_landed() {
    let mut r = residency(20, 40);
    r.insert_host("a", image(8, 1))
        .expect("within the host budget");
    r.insert_host("b", image(8, 2))
        .expect("within the host budget");
    let mem = r.memory().clone();
    r.ensure_device(&"a", &[], never)
        .expect("a resident or loadable checkpoint");
    let mut table = ResidentTable::new(&mem, 1).expect("room for the table");
    r.swap_to(&mut table, &"a")
        .expect("a checkpoint on the device");
    assert_eq!(follow(&mem, &table), vec![1; 4]);

    // The batch runs on `a`; `b` starts up and the call returns at once.
    assert_eq!(
        r.prefetch(&"b", &["a"], never).expect("a known checkpoint"),
        Readiness::Copying
    );
    assert_eq!(r.tier(&"b"), Tier::Uploading);
    assert_eq!(mem.pending_copies(), 1);
    assert_eq!(r.ready(&"b").expect("a known checkpoint"), None);
    let refused = r.swap_to(&mut table, &"b").unwrap_err().to_string();
    assert!(refused.contains("not ready on the device"), "{refused}");
    // The table still names `a`, whose bytes are intact.
    assert_eq!(follow(&mem, &table), vec![1; 4]);
    // Asking again while it copies starts nothing new.
    assert_eq!(
        r.prefetch(&"b", &["a"], never).expect("a known checkpoint"),
        Readiness::Copying
    );
    assert_eq!((r.moves().uploads, mem.pending_copies()), (2, 1));

    // The copy stream runs the copy: `b` is on the device, and swapping
    // to it is one table copy.
    assert_eq!(mem.run_copies(1), 1);
    assert_eq!(r.tier(&"b"), Tier::Device);
    r.swap_to(&mut table, &"b")
        .expect("a checkpoint on the device");
    assert_eq!(follow(&mem, &table), vec![2; 4]);
    r.swap_to(&mut table, &"a")
        .expect("a checkpoint on the device");
    assert_eq!(follow(&mem, &table), vec![1; 4]);
    assert_eq!(table.swaps(), 3);
    assert_eq!(r.moves().uploads, 2, "swaps copy no weights");
    // Once landed, `b`'s host bytes are released.
    assert_eq!(r.host_used(), 0);
}

/// Eviction never takes a checkpoint whose copy is in flight (its buffer
/// is being written), nor one of the running batch.
#[test]
fn an_upload_in_flight_is_never_evicted() {
    let mut r = residency(20, 100);
    let load = |fill| move || Ok(image(8, fill));
    r.ensure_device(&"a", &[], load(1))
        .expect("a resident or loadable checkpoint");
    assert_eq!(
        r.prefetch(&"b", &[], load(2)).expect("a known checkpoint"),
        Readiness::Copying
    );
    // Room for `c`: `a` goes (settled, least recently used); `b` stays.
    assert_eq!(
        r.prefetch(&"c", &[], load(3)).expect("a known checkpoint"),
        Readiness::Copying
    );
    assert_eq!(r.tier(&"a"), Tier::Host);
    assert_eq!(
        (r.tier(&"b"), r.tier(&"c")),
        (Tier::Uploading, Tier::Uploading)
    );
    // Both on the device are being written: nothing may go for `d`.
    let err = r.prefetch(&"d", &[], load(4)).unwrap_err();
    assert!(matches!(err, CudaError::Budget { .. }), "{err}");
    assert_eq!(r.tier(&"d"), Tier::Host, "the loaded copy is kept");
    let mem = r.memory().clone();
    assert_eq!(mem.run_copies(10), 2);
    let b = r
        .ready(&"b")
        .expect("a known checkpoint")
        .expect("its copy landed");
    let c = r
        .ready(&"c")
        .expect("a known checkpoint")
        .expect("its copy landed");
    assert_eq!(mem.read_at(b[0], 4), Some(vec![2; 4]));
    assert_eq!(mem.read_at(c[0], 4), Some(vec![3; 4]));
    // Settled now, both may go: `b` is the least recently used, but
    // busy, so `c` makes room for `d`.
    r.ensure_device(&"d", &["b"], never)
        .expect("a resident or loadable checkpoint");
    assert_eq!(r.tier(&"c"), Tier::Host);
    assert_eq!((r.tier(&"b"), r.tier(&"d")), (Tier::Device, Tier::Device));
    assert!(r.device_used() <= r.budgets().device);
}

/// A checkpoint evicted and uploaded again lies elsewhere: a table that
/// pointed at its old upload is copied again, never left on freed memory.
#[test]
fn a_checkpoint_uploaded_again_is_copied_into_the_table_again() {
    let mut r = residency(10, 100);
    r.insert_host("a", image(8, 1))
        .expect("within the host budget");
    r.insert_host("b", image(8, 2))
        .expect("within the host budget");
    let mem = r.memory().clone();
    let mut table = ResidentTable::new(&mem, 1).expect("room for the table");
    r.ensure_device(&"a", &[], never)
        .expect("a resident or loadable checkpoint");
    r.swap_to(&mut table, &"a")
        .expect("a checkpoint on the device");
    r.ensure_device(&"b", &[], never)
        .expect("a resident or loadable checkpoint"); // evicts `a`
    assert_eq!(r.tier(&"a"), Tier::Host);
    // The table's `a` is gone from the device: a swap refuses it.
    assert!(r.swap_to(&mut table, &"a").is_err());
    r.ensure_device(&"a", &[], never)
        .expect("a resident or loadable checkpoint");
    r.swap_to(&mut table, &"a")
        .expect("a checkpoint on the device");
    assert_eq!(table.swaps(), 2);
    assert_eq!(follow(&mem, &table), vec![1; 4]);
}
