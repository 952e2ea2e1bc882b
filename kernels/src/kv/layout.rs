//! Where a sequence's keys and values lie: blocks of a fixed number of
//! positions per layer, a sliding-window layer keeping a ring of them.
//!
//! The layout is the same on every device, so the engine computes from it
//! what a cache costs (its budget, admission, the prompt cache's blocks)
//! without asking the backend, and a backend allocates exactly the
//! blocks it names.

use crate::{KernelError, KvType};

/// Positions every block size and every copied tail is a multiple of: a
/// backend stores blocks in whole units of this many positions (the
/// CPU's attention reads a unit as one key block).
pub const KV_UNIT: usize = 32;

/// Positions per block unless configured. A KV head's part of a block is
/// one run (see the CPU's `kv_cache`), and a decode step's attention task
/// streams one run: longer runs keep the hardware prefetchers going.
/// SmolLM2 at 4k/8k context, 2 threads, decode tok/s by block size: 32
/// positions (8 KB runs) 138/79, 256 174/107, 1024 (256 KB runs) 204/131,
/// 2048 203/130. Larger blocks make the prompt cache share coarser
/// prefixes.
pub const DEFAULT_BLOCK_POSITIONS: usize = 1024;

/// The largest block (positions).
pub const MAX_BLOCK_POSITIONS: usize = 1 << 16;

/// Slots a ring holds beyond its window: a prompt chunk writes this many
/// rows (plus one) at a time in a windowed layer.
pub const RING_SLACK: usize = 128;

/// Refuses a block size caches cannot use: blocks hold whole units of
/// [`KV_UNIT`] positions.
pub fn check_block_positions(positions: usize) -> Result<usize, String> {
    if positions == 0 || !positions.is_multiple_of(KV_UNIT) || positions > MAX_BLOCK_POSITIONS {
        return Err(format!(
            "a KV block of {positions} positions: use a multiple of {KV_UNIT} from \
             {KV_UNIT} to {MAX_BLOCK_POSITIONS}"
        ));
    }
    Ok(positions)
}

/// How blocks are stored: their element type and positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvFormat {
    pub dtype: KvType,
    /// Positions per block, rounded to a usable size by [`KvFormat::new`].
    pub block_positions: usize,
}

impl KvFormat {
    /// `dtype` in blocks of `block_positions` rounded up to a usable size
    /// (see [`check_block_positions`], which callers use to refuse others).
    pub fn new(dtype: KvType, block_positions: usize) -> KvFormat {
        KvFormat {
            dtype,
            block_positions: block_positions
                .clamp(KV_UNIT, MAX_BLOCK_POSITIONS)
                .next_multiple_of(KV_UNIT),
        }
    }

    /// `dtype` in blocks of [`DEFAULT_BLOCK_POSITIONS`].
    pub fn of(dtype: KvType) -> KvFormat {
        KvFormat::new(dtype, DEFAULT_BLOCK_POSITIONS)
    }
}

/// Elements of one layer's block: keys and values of `positions` for every
/// KV head (its bytes: [`KvType::bytes_of`]).
pub fn block_len(n_kv_heads: usize, head_dim: usize, positions: usize) -> Option<usize> {
    n_kv_heads
        .checked_mul(head_dim)?
        .checked_mul(positions)?
        .checked_mul(2)
}

/// What one block holds: every KV head's keys and values of `positions`
/// (a multiple of [`super::KV_UNIT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBlockShape {
    pub dtype: KvType,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub positions: usize,
}

impl KvBlockShape {
    /// Bytes of the block; `None` on overflow.
    pub fn bytes(&self) -> Option<usize> {
        block_len(self.n_kv_heads, self.head_dim, self.positions)
            .and_then(|len| self.dtype.bytes_of(len))
    }
}

/// The blocks of one sequence's cache, every layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    dtype: KvType,
    /// Positions per block of this cache.
    block: usize,
    /// Whether `block` is the format's (a shorter cache's is not, and
    /// shares none).
    full_blocks: bool,
    /// Per layer, its sliding window (positions a row sees, itself
    /// included), if any.
    windows: Vec<Option<usize>>,
    /// Per layer, the blocks it may hold: the capacity's, or a windowed
    /// layer's ring when that is smaller.
    max_blocks: Vec<usize>,
    /// Bytes of one layer's block (checked at construction).
    block_bytes: usize,
}

fn overflow(layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> KernelError {
    KernelError::Shape {
        op: "kv_cache",
        detail: format!(
            "{layers} layers × {n_kv_heads} KV heads × {head_dim} × {capacity} positions \
             overflows memory; lower the context length"
        ),
    }
}

impl KvLayout {
    /// The layout of a cache of `capacity` positions in `format`, whose
    /// layer `l` keeps a ring for `windows[l]` when that is `Some` (layers
    /// past `windows` keep every position).
    pub fn new(
        format: KvFormat,
        layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        windows: &[Option<usize>],
    ) -> Result<KvLayout, KernelError> {
        // A cache shorter than the format's block takes one block of its
        // own length: a short request does not hold 1,024 positions of
        // memory per layer. Its block is never full-sized, so it shares none.
        let block = format
            .block_positions
            .min(capacity.max(1).next_multiple_of(KV_UNIT));
        let full = capacity.div_ceil(block);
        let window_of = |l: usize| windows.get(l).copied().flatten().filter(|w| *w > 0);
        let max_blocks: Vec<usize> = (0..layers)
            .map(|l| match window_of(l) {
                Some(w) => w.saturating_add(RING_SLACK).div_ceil(block).min(full),
                None => full,
            })
            .collect();
        let dtype = format.dtype;
        dtype.check_head_dim(head_dim)?;
        let block_bytes = block_len(n_kv_heads, head_dim, block)
            .and_then(|len| dtype.bytes_of(len))
            .ok_or_else(|| overflow(layers, n_kv_heads, head_dim, capacity))?;
        max_blocks
            .iter()
            .try_fold(0usize, |total, b| {
                total.checked_add(b.checked_mul(block_bytes)?)
            })
            .filter(|bytes| *bytes <= isize::MAX as usize)
            .ok_or_else(|| overflow(layers, n_kv_heads, head_dim, capacity))?;
        Ok(KvLayout {
            layers,
            n_kv_heads,
            head_dim,
            capacity,
            dtype,
            block,
            full_blocks: block == format.block_positions,
            windows: (0..layers).map(window_of).collect(),
            max_blocks,
            block_bytes,
        })
    }

    pub fn layers(&self) -> usize {
        self.layers
    }

    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn dtype(&self) -> KvType {
        self.dtype
    }

    /// Positions per block of this cache.
    pub fn block_positions(&self) -> usize {
        self.block
    }

    /// Whether the blocks are the format's size, so that they can be
    /// shared with other caches of the format.
    pub fn full_blocks(&self) -> bool {
        self.full_blocks
    }

    /// Layer `layer`'s sliding window, if it has one.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }

    /// Whether some layer keeps a sliding-window ring (whose blocks are
    /// overwritten as the window moves, so never shared).
    pub fn windowed(&self) -> bool {
        self.windows.iter().any(Option::is_some)
    }

    /// The blocks layer `layer` may hold (0 for an unknown layer).
    pub fn max_blocks(&self, layer: usize) -> usize {
        self.max_blocks.get(layer).copied().unwrap_or(0)
    }

    /// One layer's block of `positions` (the layout's own blocks, or a
    /// shorter copied tail).
    pub fn block_shape(&self, positions: usize) -> KvBlockShape {
        KvBlockShape {
            dtype: self.dtype,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            positions,
        }
    }

    /// Bytes of one layer's block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Bytes of every block the cache may hold beyond its first
    /// `prefix_blocks` of each layer (shared blocks held elsewhere).
    pub fn bytes_beyond(&self, prefix_blocks: usize) -> usize {
        // `new` checked the sum without a prefix, which bounds this one.
        self.max_blocks
            .iter()
            .map(|b| b.saturating_sub(prefix_blocks) * self.block_bytes)
            .sum()
    }

    /// Bytes of a block of `positions` in every layer (a shared block, or
    /// a copied tail); `None` on overflow.
    pub fn shared_bytes(&self, positions: usize) -> Option<usize> {
        block_len(self.n_kv_heads, self.head_dim, positions)
            .and_then(|len| self.dtype.bytes_of(len))
            .and_then(|b| b.checked_mul(self.layers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_are_whole_units() {
        assert_eq!(check_block_positions(1024), Ok(1024));
        assert_eq!(check_block_positions(32), Ok(32));
        for bad in [0, 31, 48, 1 << 17] {
            let err = check_block_positions(bad).unwrap_err();
            assert!(err.contains("multiple of 32"), "{bad}: {err}");
        }
        assert_eq!(KvFormat::new(KvType::F16, 40).block_positions, 64);
        assert_eq!(KvFormat::new(KvType::F16, 0).block_positions, 32);
    }

    #[test]
    fn a_short_cache_takes_a_block_of_its_length_and_rings_stay_small() {
        let format = KvFormat::new(KvType::F16, 256);
        let short = KvLayout::new(format, 2, 1, 64, 90, &[]).unwrap();
        assert_eq!((short.block_positions(), short.full_blocks()), (96, false));
        let ringed = KvLayout::new(format, 2, 1, 64, 4096, &[Some(200), None]).unwrap();
        assert_eq!((ringed.max_blocks(0), ringed.max_blocks(1)), (2, 16));
        assert!(ringed.windowed());
        // Two layers: the ring and the whole context, less one prefix block each.
        let block = ringed.block_bytes();
        assert_eq!(block, 2 * 256 * 64 * 2);
        assert_eq!(ringed.bytes_beyond(1), (1 + 15) * block);
        assert_eq!(ringed.shared_bytes(32), Some(2 * 2 * 32 * 64 * 2));
    }

    #[test]
    fn an_overflowing_layout_is_refused() {
        let format = KvFormat::of(KvType::F32);
        assert!(KvLayout::new(format, 1 << 20, 1 << 20, 1 << 10, 1 << 30, &[]).is_err());
        assert!(KvLayout::new(KvFormat::of(KvType::Q8_0), 1, 1, 80, 64, &[]).is_err());
    }
}
