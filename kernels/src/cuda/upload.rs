//! A checkpoint's weights as one device image: every tensor of an
//! architecture's slot layout packed into one buffer at 256-byte aligned
//! offsets, in GGUF block layout (the kernels decode the blocks where they
//! lie; nothing is converted but the placement). One allocation per
//! checkpoint keeps a tier move one copy, and makes a checkpoint's pointer
//! table its base address plus these offsets.

use super::memory::DEVICE_ALIGN;
use super::CudaError;
use crate::{DType, WeightView};

/// The weight slots of one architecture (`blk.0.attn_q`, ...), numbered in
/// order: slot `i` is entry `i` of every pointer table, so checkpoints of
/// one architecture share the kernels' slot arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    names: Vec<String>,
}

impl SlotLayout {
    pub fn new(names: Vec<String>) -> Result<SlotLayout, CudaError> {
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(CudaError::Layout(format!(
                    "weight slot `{n}` is named twice"
                )));
            }
        }
        Ok(SlotLayout { names })
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The slot number of `name`.
    pub fn slot(&self, name: &str) -> Option<u32> {
        self.names
            .iter()
            .position(|n| n == name)
            .and_then(|i| u32::try_from(i).ok())
    }

    pub fn name(&self, slot: u32) -> Option<&str> {
        self.names.get(slot as usize).map(String::as_str)
    }
}

/// One tensor's place in an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub offset: usize,
    pub bytes: usize,
}

/// A checkpoint packed for upload: `bytes` goes to the device as is.
#[derive(Clone, Debug)]
pub struct WeightImage {
    pub bytes: Vec<u8>,
    /// Per slot of the layout.
    pub placed: Vec<Placed>,
}

impl WeightImage {
    /// Packs one tensor per slot of `layout`; every slot must be given
    /// exactly once.
    pub fn pack(
        layout: &SlotLayout,
        tensors: Vec<(&str, WeightView)>,
    ) -> Result<WeightImage, CudaError> {
        let mut by_slot: Vec<Option<WeightView>> = vec![None; layout.len()];
        for (name, view) in tensors {
            let slot = layout
                .slot(name)
                .ok_or_else(|| CudaError::Layout(format!("tensor `{name}` has no weight slot")))?;
            if by_slot[slot as usize].replace(view).is_some() {
                return Err(CudaError::Layout(format!("tensor `{name}` given twice")));
            }
        }
        let mut placed = Vec::with_capacity(layout.len());
        let mut end = 0usize;
        for (slot, view) in by_slot.iter().enumerate() {
            let Some(view) = view else {
                let name = layout.name(slot as u32).unwrap_or("?");
                return Err(CudaError::Layout(format!(
                    "weight slot `{name}` has no tensor"
                )));
            };
            let offset = end.next_multiple_of(DEVICE_ALIGN as usize);
            let bytes = view.data.len();
            placed.push(Placed {
                dtype: view.dtype,
                rows: view.rows,
                cols: view.cols,
                offset,
                bytes,
            });
            end = offset + bytes;
        }
        let mut bytes = vec![0u8; end];
        for (p, view) in placed.iter().zip(by_slot.iter().flatten()) {
            bytes[p.offset..p.offset + p.bytes].copy_from_slice(&view.data);
        }
        Ok(WeightImage { bytes, placed })
    }

    /// The pointer-table entries of this image uploaded at `base`.
    pub fn table_entries(&self, base: u64) -> Vec<u64> {
        self.placed.iter().map(|p| base + p.offset as u64).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn view(dtype: DType, rows: usize, cols: usize, fill: u8) -> WeightView {
        let n = dtype.bytes_for(cols).unwrap() * rows;
        WeightView::new(dtype, rows, cols, Bytes::from(vec![fill; n])).unwrap()
    }

    #[test]
    fn tensors_pack_aligned_in_slot_order() {
        let layout = SlotLayout::new(vec!["norm".into(), "q".into()]).unwrap();
        let image = WeightImage::pack(
            &layout,
            vec![
                ("q", view(DType::Q4_0, 3, 64, 7)),
                ("norm", view(DType::F32, 1, 10, 1)),
            ],
        )
        .unwrap();
        assert_eq!(image.placed[0].offset, 0);
        assert_eq!(image.placed[0].bytes, 40);
        assert_eq!(image.placed[1].offset, 256);
        assert_eq!(image.placed[1].bytes, 3 * 2 * 18);
        assert_eq!(image.bytes.len(), 256 + 108);
        assert!(image.bytes[40..256].iter().all(|b| *b == 0));
        assert!(image.bytes[256..].iter().all(|b| *b == 7));
        assert_eq!(image.table_entries(0x1000), vec![0x1000, 0x1100]);
    }

    #[test]
    fn missing_unknown_and_repeated_tensors_are_named() {
        let layout = SlotLayout::new(vec!["a".into(), "b".into()]).unwrap();
        let err =
            |t: Vec<(&str, WeightView)>| WeightImage::pack(&layout, t).unwrap_err().to_string();
        assert!(err(vec![("a", view(DType::F32, 1, 1, 0))]).contains("`b` has no tensor"));
        assert!(err(vec![("c", view(DType::F32, 1, 1, 0))]).contains("`c` has no weight slot"));
        assert!(err(vec![
            ("a", view(DType::F32, 1, 1, 0)),
            ("a", view(DType::F32, 1, 1, 0))
        ])
        .contains("`a` given twice"));
        assert!(SlotLayout::new(vec!["x".into(), "x".into()]).is_err());
    }
}
