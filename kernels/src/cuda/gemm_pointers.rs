//! How a product of many rows names a float weight to cuBLAS so that a
//! captured step stays valid across checkpoint swaps.
//!
//! `cublasGemmEx` takes its matrices by address at the call, and a graph
//! captured around it keeps that address: another checkpoint's F32/F16
//! weight would need another graph. `cublasGemmBatchedEx` (a batch of one)
//! takes arrays of addresses in device memory instead, and reads them when
//! it runs. Its A array is the weight's entry in the table the step's
//! launches read (the backend's weight table, or in a keyed step the
//! addresses staged in the step arena, `backend/weight_refs.rs`): a swap
//! rewrites that entry, and the replayed GEMM reads the new checkpoint's
//! weight. B and C (the rows and the output) are staged beside it; their
//! addresses are part of the call's signature already.
//!
//! The arithmetic here is what the backend launches with; the tests run
//! it over [`super::HostMemory`] under the step-graph bookkeeping.

/// Bytes of one device address in a pointer array.
pub const POINTER: u64 = 8;

/// The three pointer arrays of one batched GEMM (a batch of one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmArrays {
    /// The weight's table entry.
    pub a: u64,
    /// The rows' address, staged.
    pub b: u64,
    /// The output's address, staged right after `b`.
    pub c: u64,
}

/// The device address of entry `slot` of the table at `table`: an array
/// of one pointer, the weight's current address.
pub fn table_entry(table: u64, slot: u32) -> u64 {
    table + POINTER * u64::from(slot)
}

/// What to stage for B and C: the rows' and the output's addresses.
pub fn operand_bytes(rows: u64, out: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&rows.to_le_bytes());
    bytes[8..].copy_from_slice(&out.to_le_bytes());
    bytes
}

/// The arrays of a GEMM over the weight at `(table, slot)` whose operand
/// bytes ([`operand_bytes`]) were staged at `staged`.
pub fn arrays(table: u64, slot: u32, staged: u64) -> GemmArrays {
    GemmArrays {
        a: table_entry(table, slot),
        b: staged,
        c: staged + POINTER,
    }
}

#[cfg(test)]
#[path = "gemm_pointers_tests.rs"]
mod tests;
