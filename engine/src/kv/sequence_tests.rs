use switchyard_kernels::{
    on_each_device, AttentionRows, AttentionShape, Backend, DType, KvFormat, KvType, WeightView,
};

use super::*;
use crate::kv::{CachedBlock, KvConfig, KvPool};

const BLOCK: usize = 32;

fn shape() -> AttentionShape {
    AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 32,
        scale: 0.2,
        window: None,
        softcap: None,
    }
}

/// `values` (rows of 32) as `backend`'s activations, through an F32
/// embedding table: the trait's one way to put chosen rows on a device.
fn rows_of<B: Backend>(backend: &B, values: &[f32]) -> B::Activations {
    let n = values.len() / 32;
    let bytes = bytes::Bytes::copy_from_slice(bytemuck::cast_slice(values));
    let table = backend
        .matrix(
            WeightView::new(DType::F32, n, 32, bytes)
                .expect("an F32 table of whole rows is a valid view"),
        )
        .expect("an F32 table of whole rows is a valid view");
    let tokens: Vec<u32> = (0..n as u32).collect();
    let mut x = backend.activations(n, 32);
    backend
        .embed(&table, &tokens, &mut x)
        .expect("the table has a row per token");
    x
}

/// Writes positions `from..to` of both layers of `kv` (one KV head of 32):
/// value `v` at each dimension of position `p` is `(p * 32 + d) % 7 / 7`.
fn write<B: Backend>(backend: &B, kv: &mut SequenceKv<B>, from: usize, to: usize) {
    let n = to - from;
    let values: Vec<f32> = (from * 32..to * 32).map(|i| (i % 7) as f32 / 7.0).collect();
    let x = rows_of(backend, &values);
    let mut out = backend.activations(n, 32);
    let blocks = Arc::clone(kv.blocks());
    let table = kv
        .prepare(backend, from..to)
        .expect("the positions fit the cache's capacity");
    let mut store = blocks.lock();
    for layer in 0..2 {
        let seqs = [AttentionRows {
            table,
            rows: 0..n,
            start_pos: from,
            prompt: true,
        }];
        backend
            .attention(layer, shape(), &x, &x, &x, &mut store, &seqs, &mut out)
            .expect("the test's attention shapes agree");
    }
}

/// The attention output of one query row at `pos` of layer 1 (which reads
/// every position up to it).
fn read<B: Backend>(backend: &B, kv: &mut SequenceKv<B>, pos: usize) -> Vec<f32> {
    let values: Vec<f32> = (pos * 32..(pos + 1) * 32)
        .map(|i| (i % 7) as f32 / 7.0)
        .collect();
    let x = rows_of(backend, &values);
    let mut out = backend.activations(1, 32);
    let blocks = Arc::clone(kv.blocks());
    let table = kv
        .prepare(backend, pos..pos + 1)
        .expect("the positions fit the cache's capacity");
    let mut store = blocks.lock();
    let seqs = [AttentionRows {
        table,
        rows: 0..1,
        start_pos: pos,
        prompt: false,
    }];
    backend
        .attention(1, shape(), &x, &x, &x, &mut store, &seqs, &mut out)
        .expect("the test's attention shapes agree");
    let mut staging = Vec::new();
    backend.host_rows(&out, &mut staging).to_vec()
}

fn blocks_of<B: Backend>(backend: &B, budget: usize, dtype: KvType) -> Arc<KvBlocks<B>> {
    let pool = KvPool::new(KvConfig {
        dtype,
        budget_bytes: budget,
        block_positions: BLOCK,
    });
    KvBlocks::new(backend, &pool).expect("the test's pool is valid")
}

fn layout() -> KvLayout {
    KvLayout::new(KvFormat::new(KvType::F32, BLOCK), 2, 1, 32, 4 * BLOCK, &[])
        .expect("the test's layout is valid")
}

fn caches_and_shared_blocks_hold_their_budget_until_the_last_handle_drops<B: Backend>(
    backend: Arc<B>,
) {
    let backend = &*backend;
    let blocks = blocks_of(backend, usize::MAX / 2, KvType::F32);
    let pool = Arc::clone(blocks.pool());
    let mut first = SequenceKv::new(backend, &blocks, layout(), KvPrefix::none())
        .expect("the test's pool holds the test's caches");
    let own = first.layout().bytes_beyond(0);
    assert_eq!((pool.reserved_bytes(), first.reserved_bytes()), (own, own));
    write(backend, &mut first, 0, BLOCK + 8);
    // Two layers, two blocks each: allocated as positions were written.
    assert_eq!(blocks.blocks(), 4);
    let block = first
        .share(backend, 0..BLOCK, false)
        .expect("a whole written block can be shared");
    // 2 layers × keys and values × 32 positions × 32 dims × 4 bytes.
    assert_eq!(block.bytes(), 2 * 2 * BLOCK * 32 * 4);
    assert_eq!(pool.reserved_bytes(), own + block.bytes());
    // Shared in place: no block more.
    assert_eq!(blocks.blocks(), 4);
    // Positions not yet written cannot be had, and reserve nothing.
    assert!(first.share(backend, BLOCK..2 * BLOCK, false).is_err());
    assert_eq!(pool.reserved_bytes(), own + block.bytes());

    let prefix = KvPrefix {
        shared: std::slice::from_ref(&block),
        tail: None,
    };
    let mut second = SequenceKv::new(backend, &blocks, layout(), prefix)
        .expect("the test's pool holds the test's caches");
    assert_eq!(second.len(), BLOCK);
    assert_eq!(second.reserved_bytes(), own - 2 * BLOCK * 2 * 32 * 4);
    assert_eq!(block.holders(), 2);
    // It reads what the first wrote.
    write(backend, &mut second, BLOCK, BLOCK + 8);
    assert_eq!(read(backend, &mut second, BLOCK + 8), {
        let mut again = SequenceKv::new(backend, &blocks, layout(), KvPrefix::none())
            .expect("the test's pool holds the test's caches");
        write(backend, &mut again, 0, BLOCK + 8);
        read(backend, &mut again, BLOCK + 8)
    });
    // A block it started from comes back as it is: no second reservation.
    let again = second
        .share(backend, 0..BLOCK, false)
        .expect("a whole written block can be shared");
    assert_eq!(block.holders(), 3);
    drop(again);
    let before = pool.reserved_bytes();
    drop(first);
    drop(second);
    assert_eq!(
        before - pool.reserved_bytes(),
        2 * own - 2 * BLOCK * 2 * 32 * 4
    );
    assert_eq!(pool.reserved_bytes(), block.bytes());
    // Only the shared block's two layers are left.
    assert_eq!(blocks.blocks(), 2);
    drop(block);
    assert_eq!((pool.reserved_bytes(), blocks.blocks()), (0, 0));
}

on_each_device!(
    caches_and_shared_blocks_hold_their_budget_until_the_last_handle_drops,
    threads = 1,
    cpu_only = "F32 KV and heads of 32"
);

fn a_shared_block_is_never_written_and_a_tail_is_copied<B: Backend>(backend: Arc<B>) {
    let backend = &*backend;
    let blocks = blocks_of(backend, usize::MAX / 2, KvType::F32);
    let mut first = SequenceKv::new(backend, &blocks, layout(), KvPrefix::none())
        .expect("the test's pool holds the test's caches");
    write(backend, &mut first, 0, BLOCK + 5);
    let head = first
        .share(backend, 0..BLOCK, false)
        .expect("a whole written block can be shared");
    // The first sequence cannot rewrite the block it handed out...
    match first.prepare(backend, 3..4) {
        Err(KvError::SharedWrite { position: 3 }) => {}
        other => panic!("expected a shared-write refusal, got {:?}", other.err()),
    }
    // ...until the prompt cache lets it go.
    let tail_source = first
        .share(backend, 0..BLOCK, false)
        .expect("a whole written block can be shared");
    drop(tail_source);
    let tail = {
        let mut other = SequenceKv::new(backend, &blocks, layout(), KvPrefix::none())
            .expect("the test's pool holds the test's caches");
        write(backend, &mut other, 0, BLOCK);
        other
            .share(backend, 0..BLOCK, false)
            .expect("a whole written block can be shared")
    };
    assert!(
        first.share(backend, BLOCK..BLOCK + 16, false).is_err(),
        "half a unit"
    );
    let prefix = KvPrefix {
        shared: &[],
        tail: Some((&tail, 32)),
    };
    let mut copied = SequenceKv::new(backend, &blocks, layout(), prefix)
        .expect("the test's pool holds the test's caches");
    assert_eq!(copied.len(), 32);
    // The copied positions are its own: it may write them.
    assert!(copied.prepare(backend, 31..32).is_ok());
    drop(head);
    assert!(first.prepare(backend, 3..4).is_ok());
    // A gap is refused.
    assert!(matches!(
        copied.prepare(backend, 40..41),
        Err(KvError::Gap { start: 40, len: 32 })
    ));
}

on_each_device!(
    a_shared_block_is_never_written_and_a_tail_is_copied,
    threads = 1,
    cpu_only = "F32 KV and heads of 32"
);

fn truncate_rolls_back_positions_and_frees_whole_blocks<B: Backend>(backend: Arc<B>) {
    let backend = &*backend;
    let blocks = blocks_of(backend, usize::MAX / 2, KvType::F32);
    let mut kv = SequenceKv::new(backend, &blocks, layout(), KvPrefix::none())
        .expect("the test's pool holds the test's caches");
    write(backend, &mut kv, 0, BLOCK + 3);
    let want = read(backend, &mut kv, BLOCK + 3);
    // Four draft positions, rejected: the next step goes on from before them.
    write(backend, &mut kv, BLOCK + 4, 2 * BLOCK + 2);
    assert_eq!(blocks.blocks(), 6);
    kv.truncate(BLOCK + 3)
        .expect("truncating within the cache cannot fail");
    assert_eq!(kv.len(), BLOCK + 3);
    assert_eq!(
        blocks.blocks(),
        4,
        "the third block of each layer went back"
    );
    assert_eq!(read(backend, &mut kv, BLOCK + 3), want);
    // Growing again is fine, and shrinking past nothing is a no-op.
    kv.truncate(10 * BLOCK)
        .expect("truncating within the cache cannot fail");
    assert_eq!(kv.len(), BLOCK + 4);

    let windowed = KvLayout::new(
        KvFormat::new(KvType::F32, BLOCK),
        2,
        1,
        32,
        1024,
        &[Some(64), None],
    )
    .expect("a windowed layout of whole blocks is valid");
    let mut ring = SequenceKv::new(backend, &blocks, windowed, KvPrefix::none())
        .expect("the test's pool holds the test's caches");
    ring.prepare(backend, 0..600)
        .expect("the positions fit the cache's capacity");
    assert!(ring.truncate(590).is_ok());
    assert!(matches!(
        ring.truncate(100),
        Err(KvError::Rollback { asked: 490, .. })
    ));
}

on_each_device!(
    truncate_rolls_back_positions_and_frees_whole_blocks,
    threads = 1,
    cpu_only = "F32 KV and heads of 32"
);

fn a_cache_past_the_budget_is_refused_before_the_backend_allocates<B: Backend>(backend: Arc<B>) {
    let backend = &*backend;
    let blocks = blocks_of(backend, 1000, KvType::F16);
    let layout = KvLayout::new(blocks.pool().format(), 2, 1, 32, 4 * BLOCK, &[])
        .expect("the test's layout is valid");
    match SequenceKv::new(backend, &blocks, layout, KvPrefix::none()) {
        Err(KvError::Budget {
            needed,
            budget: 1000,
            free: 1000,
        }) => {
            assert_eq!(needed, 2 * 4 * 2 * BLOCK * 32 * 2);
        }
        Err(e) => panic!("expected a budget refusal, got {e}"),
        Ok(_) => panic!("expected a budget refusal"),
    }
    assert_eq!((blocks.pool().reserved_bytes(), blocks.blocks()), (0, 0));
}

on_each_device!(
    a_cache_past_the_budget_is_refused_before_the_backend_allocates,
    threads = 1,
    cpu_only = "heads of 32"
);
