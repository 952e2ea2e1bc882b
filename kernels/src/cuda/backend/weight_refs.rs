//! How a launch names its weights. Outside a keyed step: the backend's
//! weight table and each tensor's own slot. Inside one: a small table of
//! this step's weight addresses staged in the step arena (kind
//! [`kind::WEIGHTS`]), named by position. A captured graph then holds the
//! arena's address and positions, never a checkpoint's slot or address,
//! so another checkpoint of the same shapes replays it: its addresses are
//! staged at the same places, and only the bytes that changed are copied
//! before the launch (8 per tensor on a swap, none otherwise). This is the
//! pointer-table swap of `pointer_table.rs`, carried by the arena.

use super::super::ops_layers::WeightRef;
use super::step::kind;
use super::tensors::{CudaMatrix, CudaVector};
use super::{device_err, CudaBackend};
use crate::KernelError;

/// A weight as the backend holds it: its slot and device address.
#[derive(Clone, Copy)]
pub(super) struct Held {
    slot: u32,
    address: u64,
}

impl CudaBackend {
    /// Refused while `m` is not on the device (demoted, or its copy up
    /// still in flight): a step never reads a matrix being written.
    pub(super) fn held_matrix(&self, m: &CudaMatrix) -> Result<Held, KernelError> {
        Ok(Held {
            slot: m.slot(),
            address: self.tiers.address(&m.weight).map_err(device_err)?,
        })
    }

    pub(super) fn held_vector(&self, v: &CudaVector) -> Held {
        Held {
            slot: v.slot(),
            address: self.addr(&*v.buf),
        }
    }

    /// How this step's launch names `weights`, in order (see the module
    /// documentation).
    pub(super) fn weight_refs(&self, weights: &[Held]) -> Result<Vec<WeightRef>, KernelError> {
        if !self.keyed() {
            let table = self.tiers.table().address();
            return Ok(weights
                .iter()
                .map(|w| WeightRef {
                    table,
                    slot: w.slot,
                })
                .collect());
        }
        let bytes: Vec<u8> = weights
            .iter()
            .flat_map(|w| w.address.to_le_bytes())
            .collect();
        let staged = self.stage(&bytes, kind::WEIGHTS)?;
        Ok((0u32..)
            .zip(weights)
            .map(|(slot, _)| WeightRef {
                table: staged.addr,
                slot,
            })
            .collect())
    }

    /// [`CudaBackend::weight_refs`] of one weight.
    pub(super) fn weight_ref(&self, weight: Held) -> Result<WeightRef, KernelError> {
        self.weight_refs(&[weight])?
            .pop()
            .ok_or_else(|| KernelError::Device("no weight reference".into()))
    }
}
