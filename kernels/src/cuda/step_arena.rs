//! The small inputs of one step (token ids, positions, RoPE frequencies,
//! attention tables) staged at fixed places of one device buffer, so that
//! a captured step reads next step's inputs where it read this one's, and
//! a byte that did not change since the last step is not copied again.
//!
//! The arena keeps two host images of the buffer: `image`, what this step
//! wrote, and `shadow`, what the device holds. Staging writes `image` and
//! marks the bytes that differ from `shadow` dirty; [`StepArena::take_dirty`]
//! hands the dirty ranges to the caller to copy (at once for an eager
//! launch, all together before a graph's launch) and moves them into
//! `shadow`. A step that is abandoned before its copies (a replay that
//! diverged) leaves `shadow` true, so nothing is lost.
//!
//! Inside a step, bytes equal to an earlier segment's of the same kind (a
//! layer's row positions, the same as the layer before) are not staged
//! twice; kinds keep the sharing from depending on chance equalities (a
//! block table that happens to equal the positions), which would make a
//! step's layout depend on its values. A replay
//! follows the captured layout instead of choosing: segment `j` goes where
//! the capture put it, and if the capture had found it equal to an earlier
//! segment, it must still be, or the replay diverges.

use std::ops::Range;

/// Every segment starts on this boundary (the kernels read i32 and f32
/// arrays; 16 keeps vector loads possible).
pub const ALIGN: usize = 16;

/// Where a step's segment lies in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: usize,
    pub len: usize,
    /// What it holds (the caller's kinds: positions, a block table...).
    pub kind: u8,
}

/// Why a segment could not be staged.
#[derive(Debug, PartialEq, Eq)]
pub enum StageError {
    /// The arena is too small: grow it to at least `need` bytes.
    Full { need: usize },
    /// A replay's segment does not fit the captured layout.
    Diverged(String),
}

/// The arena; see the module documentation.
pub struct StepArena {
    image: Vec<u8>,
    shadow: Vec<u8>,
    cursor: usize,
    segments: Vec<Segment>,
    /// Segments before this index are not reused (the buffer grew since).
    reuse_from: usize,
    dirty: Vec<Range<usize>>,
    /// Bytes handed out to copy, over the arena's life (the GPU check
    /// reports them per step).
    pub copied_bytes: u64,
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

impl StepArena {
    /// An arena of `capacity` bytes over a zero-filled device buffer.
    pub fn new(capacity: usize) -> StepArena {
        StepArena {
            image: vec![0; capacity],
            shadow: vec![0; capacity],
            cursor: 0,
            segments: Vec::new(),
            reuse_from: 0,
            dirty: Vec::new(),
            copied_bytes: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.image.len()
    }

    /// A new step: no segment yet; copies never taken are dropped (their
    /// bytes were never sent, so the device still holds `shadow`).
    pub fn begin(&mut self) {
        self.cursor = 0;
        self.segments.clear();
        self.reuse_from = 0;
        self.dirty.clear();
    }

    /// This step's segments, in staging order (what a capture keeps).
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The device buffer was replaced by a zero-filled one of `capacity`
    /// bytes (at least the old): this step's segments so far are in the
    /// old buffer only, so none is reused.
    pub fn grown(&mut self, capacity: usize) {
        let capacity = capacity.max(self.capacity());
        self.image.resize(capacity, 0);
        self.shadow = vec![0; capacity];
        self.reuse_from = self.segments.len();
        self.dirty.clear();
    }

    /// Stages `bytes` and returns their offset. `captured`: the layout of
    /// the step being replayed, which this one must follow.
    pub fn stage(
        &mut self,
        bytes: &[u8],
        kind: u8,
        captured: Option<&[Segment]>,
    ) -> Result<usize, StageError> {
        let offset = match captured {
            None => match self.earlier(bytes, kind) {
                Some(offset) => {
                    self.segments.push(Segment {
                        offset,
                        len: bytes.len(),
                        kind,
                    });
                    return Ok(offset);
                }
                None => align(self.cursor),
            },
            Some(layout) => {
                let j = self.segments.len();
                let Some(s) = layout.get(j) else {
                    return Err(StageError::Diverged(format!(
                        "segment {j} staged, the capture had {}",
                        layout.len()
                    )));
                };
                if s.len != bytes.len() || s.kind != kind {
                    return Err(StageError::Diverged(format!(
                        "segment {j} of {} bytes of kind {kind}, captured with {} of kind {}",
                        bytes.len(),
                        s.len,
                        s.kind
                    )));
                }
                if layout[..j].iter().any(|e| e.offset == s.offset) {
                    // The capture found it equal to an earlier segment.
                    if self.image.get(s.offset..s.offset + s.len) != Some(bytes) {
                        return Err(StageError::Diverged(format!(
                            "segment {j} no longer equals the earlier one it was captured as"
                        )));
                    }
                    self.segments.push(*s);
                    return Ok(s.offset);
                }
                s.offset
            }
        };
        let end = offset + bytes.len();
        if end > self.capacity() {
            return Err(StageError::Full { need: end });
        }
        self.image[offset..end].copy_from_slice(bytes);
        if self.shadow[offset..end] != *bytes {
            self.dirty.push(offset..end);
        }
        self.cursor = self.cursor.max(end);
        self.segments.push(Segment {
            offset,
            len: bytes.len(),
            kind,
        });
        Ok(offset)
    }

    /// An earlier segment of this step of `kind` holding exactly `bytes`.
    fn earlier(&self, bytes: &[u8], kind: u8) -> Option<usize> {
        self.segments[self.reuse_from..]
            .iter()
            .find(|s| {
                s.kind == kind
                    && s.len == bytes.len()
                    && self.image[s.offset..s.offset + s.len] == *bytes
            })
            .map(|s| s.offset)
    }

    /// The ranges to copy from [`StepArena::image`] to the device, merged
    /// where they touch; from now on the device is taken to hold them.
    pub fn take_dirty(&mut self) -> Vec<Range<usize>> {
        let mut ranges = std::mem::take(&mut self.dirty);
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        for r in &merged {
            self.shadow[r.clone()].copy_from_slice(&self.image[r.clone()]);
            self.copied_bytes += r.len() as u64;
        }
        merged
    }

    /// What this step staged, to copy from.
    pub fn image(&self) -> &[u8] {
        &self.image
    }
}

/// `values` as the bytes the kernels read (little-endian, as the device).
pub fn bytes_of<T: Copy + Into<u32>>(values: &[T]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| (*v).into().to_le_bytes())
        .collect()
}

/// `values` (f32) as bytes.
pub fn bytes_of_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `values` (i32) as bytes.
pub fn bytes_of_i32(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::super::memory::{DeviceMemory, HostMemory};
    use super::*;

    /// Copies the dirty ranges into a host-memory "device" buffer, as the
    /// backend does with the GPU's.
    fn sync(
        arena: &mut StepArena,
        mem: &HostMemory,
        buf: &mut <HostMemory as DeviceMemory>::Buffer,
    ) -> usize {
        let mut bytes = 0;
        for r in arena.take_dirty() {
            mem.write(buf, r.start, &arena.image()[r.clone()]).unwrap();
            bytes += r.len();
        }
        bytes
    }

    fn device(
        mem: &HostMemory,
        buf: &<HostMemory as DeviceMemory>::Buffer,
        s: usize,
        len: usize,
    ) -> Vec<u8> {
        mem.read_at(mem.address(buf) + s as u64, len).unwrap()
    }

    #[test]
    fn unchanged_inputs_are_not_copied_again_and_equal_segments_are_shared() {
        let mem = HostMemory::new(1 << 16);
        let mut buf = mem.alloc(256).unwrap();
        let mut arena = StepArena::new(256);
        let positions = bytes_of(&[7u32, 9]);
        let table = bytes_of_i32(&[3, 4, 5]);
        // Step 1: positions, a table, the positions again (the next layer).
        arena.begin();
        let p = arena.stage(&positions, 0, None).unwrap();
        let t = arena.stage(&table, 1, None).unwrap();
        let p2 = arena.stage(&positions, 0, None).unwrap();
        assert_eq!((p, t, p2), (0, 16, 0));
        assert_eq!(sync(&mut arena, &mem, &mut buf), 8 + 12);
        assert_eq!(device(&mem, &buf, t, 12), table);
        // Step 2, the same inputs: nothing to copy.
        arena.begin();
        arena.stage(&positions, 0, None).unwrap();
        arena.stage(&table, 1, None).unwrap();
        assert_eq!(sync(&mut arena, &mem, &mut buf), 0);
        // Step 3: one position moves: only its 8 bytes go (one range).
        arena.begin();
        let moved = bytes_of(&[8u32, 9]);
        arena.stage(&moved, 0, None).unwrap();
        arena.stage(&table, 1, None).unwrap();
        assert_eq!(arena.dirty, vec![0..8]);
        assert_eq!(sync(&mut arena, &mem, &mut buf), 8);
        assert_eq!(device(&mem, &buf, 0, 8), moved);
        assert_eq!(arena.copied_bytes, 28);
    }

    #[test]
    fn a_replay_follows_the_captured_layout_or_diverges() {
        let mut arena = StepArena::new(256);
        let a = bytes_of(&[1u32, 2]);
        let b = bytes_of(&[5u32, 6]);
        arena.begin();
        arena.stage(&a, 0, None).unwrap();
        arena.stage(&a, 0, None).unwrap();
        arena.stage(&b, 0, None).unwrap();
        let captured = arena.segments().to_vec();
        assert_eq!(captured[1], captured[0], "the second was shared");
        arena.take_dirty();

        // Same sizes, new values where the capture put them.
        arena.begin();
        let a2 = bytes_of(&[3u32, 4]);
        assert_eq!(arena.stage(&a2, 0, Some(&captured)), Ok(0));
        assert_eq!(arena.stage(&a2, 0, Some(&captured)), Ok(0));
        // The third equals the first now: it still goes to its own place.
        assert_eq!(arena.stage(&a2, 0, Some(&captured)), Ok(captured[2].offset));
        assert_eq!(arena.take_dirty(), vec![0..8, 16..24]);

        // The shared segment no longer equal: diverged, and the copies of
        // the abandoned step are dropped at the next begin.
        arena.begin();
        arena.stage(&b, 0, Some(&captured)).unwrap();
        let e = arena.stage(&a, 0, Some(&captured));
        assert!(
            matches!(e, Err(StageError::Diverged(ref m)) if m.contains("earlier one")),
            "{e:?}"
        );
        arena.begin();
        assert!(arena.take_dirty().is_empty());
        // Another size, or one segment too many.
        assert!(matches!(
            arena.stage(&bytes_of(&[1u32]), 0, Some(&captured)),
            Err(StageError::Diverged(_))
        ));
        arena.begin();
        for _ in 0..3 {
            arena.stage(&a2, 0, Some(&captured)).unwrap();
        }
        assert!(matches!(
            arena.stage(&a2, 0, Some(&captured)),
            Err(StageError::Diverged(_))
        ));
    }

    #[test]
    fn a_full_arena_asks_to_grow_and_reuses_nothing_staged_before() {
        let mut arena = StepArena::new(32);
        arena.begin();
        let big = vec![1u8; 24];
        assert_eq!(arena.stage(&big, 0, None), Ok(0));
        assert_eq!(arena.stage(&big, 0, None), Ok(0), "shared");
        let other = vec![2u8; 24];
        assert_eq!(
            arena.stage(&other, 0, None),
            Err(StageError::Full { need: 56 })
        );
        arena.grown(128);
        assert_eq!(arena.capacity(), 128);
        assert_eq!(arena.stage(&other, 0, None), Ok(32));
        // The first segment is in the old buffer only: staged again.
        assert_eq!(arena.stage(&big, 0, None), Ok(64));
        // The device buffer is new and zero: everything staged is dirty.
        assert_eq!(arena.take_dirty(), vec![32..56, 64..88]);
    }
}
