//! Attention: per layer, the step's unit tables and row tables uploaded,
//! then the KV-write and attention kernels over the store's pool.

use super::super::attention_plan::{plan, PlanSeq};
use super::super::ops_layers::{self, AttentionBuffers, AttentionParams};
use super::super::step_arena::bytes_of_i32;
use super::super::step_graph::Launch;
use super::step::{kind, op};
use super::tensors::{CudaActivations, CudaKvStore};
use super::{device_err, CudaBackend};
use crate::kv::{BlockTable, KV_UNIT};
use crate::{AttentionRows, AttentionShape, KernelError};

fn shape_err(detail: String) -> KernelError {
    KernelError::Shape {
        op: "attention",
        detail,
    }
}

impl CudaBackend {
    /// See [`crate::Backend::attention`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend(
        &self,
        layer: usize,
        shape: AttentionShape,
        q: &CudaActivations,
        k: &CudaActivations,
        v: &CudaActivations,
        store: &mut CudaKvStore,
        seqs: &[AttentionRows<'_>],
        out: &mut CudaActivations,
    ) -> Result<(), KernelError> {
        let rows = q.rows;
        let (width, kv_width) = (
            shape.n_heads * shape.head_dim,
            shape.n_kv_heads * shape.head_dim,
        );
        let shapes_ok = q.cols == width
            && out.cols == width
            && out.rows == rows
            && k.cols == kv_width
            && v.cols == kv_width
            && k.rows == rows
            && v.rows == rows
            && shape.n_kv_heads > 0
            && shape.n_heads.is_multiple_of(shape.n_kv_heads);
        if !shapes_ok {
            return Err(shape_err(format!(
                "q {}, k {}, v {}, out {} for {} heads ({} KV) of {}",
                q.shape(),
                k.shape(),
                v.shape(),
                out.shape(),
                shape.n_heads,
                shape.n_kv_heads,
                shape.head_dim
            )));
        }
        if seqs.is_empty() || rows == 0 {
            return Ok(());
        }
        for s in seqs {
            let l = s.table.layout();
            if layer >= l.layers()
                || l.head_dim() != shape.head_dim
                || l.n_kv_heads() != shape.n_kv_heads
            {
                return Err(shape_err(format!(
                    "layer {layer}, {} KV heads of {} against a table of {:?}",
                    shape.n_kv_heads, shape.head_dim, l
                )));
            }
            if s.start_pos + s.rows.len() > l.capacity() {
                return Err(KernelError::KvCacheFull {
                    capacity: l.capacity(),
                    position: s.start_pos + s.rows.len() - 1,
                });
            }
        }
        let ends: Vec<(&BlockTable, usize)> = seqs
            .iter()
            .map(|s| (s.table, s.start_pos + s.rows.len()))
            .collect();
        let tables = store.unit_tables(layer, &ends)?;
        let plan_seqs: Vec<PlanSeq<'_>> = seqs
            .iter()
            .zip(&tables.units)
            .map(|(s, blocks)| PlanSeq {
                blocks,
                rows: s.rows.clone(),
                start_pos: s.start_pos,
            })
            .collect();
        let plan = plan(rows, KV_UNIT, &plan_seqs)?;
        // Staged: the row tables are the same for every layer of the step
        // (shared), and a unit table that did not change since the last
        // step is not copied again.
        let block_tables = self.stage(&bytes_of_i32(&plan.block_tables), kind::BLOCK_TABLES)?;
        let row_seq = self.stage(&bytes_of_i32(&plan.row_seq), kind::ROW_SEQ)?;
        let row_pos = self.stage(&bytes_of_i32(&plan.row_pos), kind::ROW_POS)?;
        let int = |n: usize| i32::try_from(n).map_err(|_| shape_err(format!("{n} exceeds i32")));
        let params = AttentionParams {
            max_blocks: int(plan.max_blocks)?,
            n_heads: int(shape.n_heads)?,
            n_kv_heads: int(shape.n_kv_heads)?,
            head_dim: int(shape.head_dim)?,
            block_positions: int(KV_UNIT)?,
            window: int(shape.window.unwrap_or(0))?,
            scale: shape.scale,
            softcap: shape.softcap.unwrap_or(0.0),
            ..AttentionParams::default()
        };
        let pool = tables.pool.address();
        let sig = [
            op::ATTENTION,
            self.addr(q.buf()?),
            self.addr(k.buf()?),
            self.addr(v.buf()?),
            self.addr(out.buf()?),
            pool,
            block_tables.addr,
            row_seq.addr,
            row_pos.addr,
            rows as u64,
            params.max_blocks as u64,
            params.n_heads as u64,
            params.n_kv_heads as u64,
            params.head_dim as u64,
            params.window as u64,
            u64::from(params.scale.to_bits()),
            u64::from(params.softcap.to_bits()),
        ];
        let entered = self.enter(&sig)?;
        if entered.launch == Launch::Skip {
            return Ok(());
        }
        ops_layers::attention(
            &self.dev,
            params,
            AttentionBuffers {
                q: q.buf()?,
                k: k.buf()?,
                v: v.buf()?,
                pool,
                block_tables: block_tables.addr,
                row_seq: row_seq.addr,
                row_pos: row_pos.addr,
                rows,
                out: out.buf_mut()?,
            },
        )
        .map_err(device_err)
    }
}
