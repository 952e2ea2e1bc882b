//! An adapter's matrix on the weight arena's 2 MB pages.
//!
//! Sixteen rank-8 adapters hold ~78 MB of `A` and `Bᵀ` in matrices of a
//! few KB each, and a decode step on sixteen adapters reads them all.
//! Left where the loader's `Vec` put them (4 KB pages, anywhere in the
//! heap), each matrix spans a few pages: ~20,000 TLB misses a step, each a
//! two-level page walk in a VM, and the hardware prefetchers stop at
//! every page boundary. On the arena's huge pages (see `weight_arena`)
//! the same bytes take a TLB entry per 2 MB, as the base's weights do.

use super::weight_arena::{ArenaBytes, WeightArena};
use crate::{KernelError, WeightView};

/// Arena bytes as the owner of a `bytes::Bytes`.
struct Owned(ArenaBytes);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// `view` with its bytes copied into `arena`.
pub(crate) fn on_huge_pages(
    view: WeightView,
    arena: &WeightArena,
) -> Result<WeightView, KernelError> {
    let mut bytes = arena.alloc(view.data.len());
    bytes.as_mut_slice().copy_from_slice(&view.data);
    let data = bytes::Bytes::from_owner(Owned(bytes));
    WeightView::new(view.dtype, view.rows, view.cols, data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    /// The matrix keeps its shape and bytes, now in an arena buffer (a
    /// copy, aligned as the arena aligns), and outlives the arena.
    #[test]
    fn an_adapter_matrix_moves_to_the_arena_unchanged() {
        let arena = WeightArena::default();
        let values: Vec<u8> = (0..3 * 40 * 2).map(|i| (i * 7) as u8).collect();
        let view = WeightView::new(DType::BF16, 3, 40, bytes::Bytes::from(values.clone()))
            .expect("bytes of the stated shape");
        let moved = on_huge_pages(view.clone(), &arena).expect("the same shape");
        drop(arena);
        assert_eq!((moved.dtype, moved.rows, moved.cols), (DType::BF16, 3, 40));
        assert_eq!(&moved.data[..], &values[..]);
        assert_ne!(moved.data.as_ptr(), view.data.as_ptr());
        assert_eq!(
            moved.data.as_ptr() as usize % super::super::weight_arena::ALIGN,
            0
        );
    }
}
