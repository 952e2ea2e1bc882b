//! What one attention launch is told about its rows (`attention.cu`'s
//! `block_tables`, `row_seq`, `row_pos`): built on the host from the
//! step's sequences, uploaded, and read by the KV-write and attention
//! kernels, which know no sequence but by these numbers.

use std::ops::Range;

use crate::KernelError;

/// One sequence of the step: its block ids in position order, its rows of
/// `q`, and the position of its first row.
pub struct PlanSeq<'a> {
    pub blocks: &'a [u32],
    pub rows: Range<usize>,
    pub start_pos: usize,
}

/// The launch's tables.
#[derive(Debug, PartialEq, Eq)]
pub struct AttentionPlan {
    /// `seqs × max_blocks` block ids, `max_blocks` rounded up to a power
    /// of two so that a step's tables keep their size (and a captured
    /// step its layout) while sequences grow (unused entries 0: never read, as a
    /// row reads only its own positions' blocks).
    pub block_tables: Vec<i32>,
    pub max_blocks: usize,
    /// Per row of `q`: its sequence.
    pub row_seq: Vec<i32>,
    /// Per row of `q`: its position.
    pub row_pos: Vec<i32>,
}

fn err(detail: String) -> KernelError {
    KernelError::Shape {
        op: "attention",
        detail,
    }
}

fn i32_of(n: usize, what: &str) -> Result<i32, KernelError> {
    i32::try_from(n).map_err(|_| err(format!("{what} {n} exceeds i32")))
}

/// The tables for `seqs` covering rows `0..rows` of the step, in order
/// (the kernels take row `i` of `q` as entry `i`, so every row must belong
/// to a sequence), each row's position inside its sequence's blocks of
/// `block_positions`.
pub fn plan(
    rows: usize,
    block_positions: usize,
    seqs: &[PlanSeq<'_>],
) -> Result<AttentionPlan, KernelError> {
    let max_blocks = seqs
        .iter()
        .map(|s| s.blocks.len())
        .max()
        .unwrap_or(0)
        .max(1)
        .next_power_of_two();
    let mut block_tables = vec![0i32; seqs.len() * max_blocks];
    let (mut row_seq, mut row_pos) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for (i, s) in seqs.iter().enumerate() {
        if s.rows.start != row_seq.len() {
            return Err(err(format!(
                "sequence {i} starts at row {}, not {}: the rows of a step's sequences \
                 must follow one another from row 0",
                s.rows.start,
                row_seq.len()
            )));
        }
        let last = s.start_pos + s.rows.len();
        if last > s.blocks.len() * block_positions {
            return Err(err(format!(
                "sequence {i} reaches position {} beyond its {} blocks",
                last - 1,
                s.blocks.len()
            )));
        }
        for (slot, id) in block_tables[i * max_blocks..].iter_mut().zip(s.blocks) {
            *slot = i32_of(*id as usize, "block id")?;
        }
        let seq = i32_of(i, "sequence")?;
        for pos in s.start_pos..last {
            row_seq.push(seq);
            row_pos.push(i32_of(pos, "position")?);
        }
    }
    if row_seq.len() != rows {
        return Err(err(format!(
            "the sequences cover {} of the step's {rows} rows",
            row_seq.len()
        )));
    }
    Ok(AttentionPlan {
        block_tables,
        max_blocks,
        row_seq,
        row_pos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_map_to_their_sequence_positions_and_blocks() {
        let (a, b) = ([7u32, 3], [5u32]);
        let p = plan(
            4,
            32,
            &[
                PlanSeq {
                    blocks: &a,
                    rows: 0..1,
                    start_pos: 40,
                },
                PlanSeq {
                    blocks: &b,
                    rows: 1..4,
                    start_pos: 0,
                },
            ],
        )
        .unwrap();
        assert_eq!(
            p,
            AttentionPlan {
                block_tables: vec![7, 3, 5, 0],
                max_blocks: 2,
                row_seq: vec![0, 1, 1, 1],
                row_pos: vec![40, 0, 1, 2],
            }
        );
    }

    #[test]
    fn the_table_width_is_a_power_of_two() {
        let blocks = [1u32, 2, 3];
        let p = plan(
            1,
            32,
            &[PlanSeq {
                blocks: &blocks,
                rows: 0..1,
                start_pos: 70,
            }],
        )
        .unwrap();
        assert_eq!((p.max_blocks, p.block_tables), (4, vec![1, 2, 3, 0]));
    }

    #[test]
    fn gaps_short_tables_and_uncovered_rows_are_refused() {
        let blocks = [1u32];
        let one = |rows: Range<usize>, start_pos| PlanSeq {
            blocks: &blocks,
            rows,
            start_pos,
        };
        let e = |r: Result<AttentionPlan, KernelError>| r.unwrap_err().to_string();
        assert!(e(plan(2, 32, &[one(1..2, 0)])).contains("starts at row 1, not 0"));
        assert!(e(plan(1, 32, &[one(0..1, 32)])).contains("position 32 beyond its 1 blocks"));
        assert!(e(plan(3, 32, &[one(0..2, 0)])).contains("cover 2 of the step's 3 rows"));
    }
}
