//! Pieces of a forward step that the example's models (`graphs`, `llama`)
//! build alike.

use switchyard_kernels::kv::BlockTable;
use switchyard_kernels::{AttentionRows, Backend, MatmulProduct};

/// `out (+)= w · input`, without a bias.
pub fn product<'a, B: Backend>(
    w: &'a B::Matrix,
    out: &'a mut B::Activations,
    accumulate: bool,
) -> MatmulProduct<'a, B> {
    MatmulProduct {
        w,
        bias: None,
        out,
        accumulate,
    }
}

/// Each sequence's rows of a step that runs `per_seq` rows for every
/// sequence of `tables` in turn, starting at its first row's position.
pub fn sequence_rows<'a>(
    tables: &'a [BlockTable],
    positions: &[u32],
    per_seq: usize,
) -> Vec<AttentionRows<'a>> {
    tables
        .iter()
        .enumerate()
        .map(|(i, table)| AttentionRows {
            table,
            rows: i * per_seq..(i + 1) * per_seq,
            start_pos: positions[i * per_seq] as usize,
            prompt: false,
        })
        .collect()
}
