//! Caches and attention: the model shape's pool (made at its first
//! cache), each cache's block table, and one launch of the KV-write and
//! attention kernels per layer for every sequence of the step.

use std::ops::Range;
use std::sync::Arc;

use super::super::attention_plan::{plan, PlanSeq};
use super::super::buffer::CudaMemory;
use super::super::kernel_names;
use super::super::kv_pool::KvPool;
use super::super::kv_table::{shape_of, BlockTable};
use super::super::memory::DeviceMemory;
use super::super::ops_layers::{self, AttentionBuffers, AttentionParams};
use super::super::CudaError;
use super::tensors::{CudaActivations, CudaKvBlock, CudaKvCache};
use super::{device_err, driver_err, poisoned, CudaBackend};
use crate::{AttentionRows, AttentionShape, KernelError, KvLayout, KvPrefix, KvType};

/// Share of the free device memory a shape's pool takes when no KV budget
/// is configured: the rest is for activations, scratch and cuBLAS.
const KV_SHARE_OF_FREE: f64 = 0.8;

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

impl CudaBackend {
    /// The pool of `layout`'s shape, made on first use.
    fn pool_for(&self, layout: &KvLayout) -> Result<Arc<KvPool<CudaMemory>>, KernelError> {
        let shape = shape_of(layout);
        let mut pools = self.pools.lock().map_err(|_| poisoned("KV pools"))?;
        if let Some(pool) = pools.iter().find(|p| p.shape() == shape) {
            return Ok(Arc::clone(pool));
        }
        let bytes = self
            .kv_bytes
            .unwrap_or_else(|| (self.memory.free_bytes() as f64 * KV_SHARE_OF_FREE) as usize);
        let blocks = shape.blocks_in(bytes);
        if blocks == 0 {
            return Err(KernelError::KvAlloc {
                bytes: shape.block_bytes() * shape.layers,
            });
        }
        let pool = KvPool::new(&self.memory, shape, blocks).map_err(|e| match e {
            CudaError::OutOfMemory { bytes, .. } => KernelError::KvAlloc { bytes },
            other => device_err(other),
        })?;
        tracing::info!(
            "cuda: KV pool of {blocks} blocks of 32 positions ({:.1} GiB) for {shape:?}",
            (blocks * shape.block_bytes() * shape.layers) as f64 / f64::from(1u32 << 30)
        );
        pools.push(Arc::clone(&pool));
        Ok(pool)
    }

    pub(super) fn new_cache(
        &self,
        layout: &KvLayout,
        prefix: KvPrefix<'_, CudaKvBlock>,
    ) -> Result<CudaKvCache, KernelError> {
        if layout.dtype() != KvType::F16 {
            return Err(shape_err(
                "kv_cache",
                format!(
                    "the CUDA backend stores keys and values as f16, not {}: use --kv-type f16",
                    layout.dtype()
                ),
            ));
        }
        if kernel_names::attention(layout.head_dim()).is_none() {
            return Err(shape_err(
                "kv_cache",
                format!(
                    "the CUDA attention kernels take heads of 64, 128 or 256, not {}",
                    layout.head_dim()
                ),
            ));
        }
        let pool = self.pool_for(layout)?;
        Ok(CudaKvCache {
            table: BlockTable::new(pool, layout, prefix)?,
            layout: layout.clone(),
        })
    }

    pub(super) fn export(
        &self,
        cache: &mut CudaKvCache,
        positions: Range<usize>,
    ) -> Result<CudaKvBlock, KernelError> {
        cache.table.export(positions)
    }

    /// See [`crate::Backend::attention`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend(
        &self,
        layer: usize,
        shape: AttentionShape,
        q: &CudaActivations,
        k: &CudaActivations,
        v: &CudaActivations,
        seqs: &mut [AttentionRows<'_, Self>],
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
            return Err(shape_err(
                "attention",
                format!(
                    "q {}, k {}, v {}, out {} for {} heads ({} KV) of {}",
                    q.shape(),
                    k.shape(),
                    v.shape(),
                    out.shape(),
                    shape.n_heads,
                    shape.n_kv_heads,
                    shape.head_dim
                ),
            ));
        }
        let Some(first) = seqs.first() else {
            return Ok(());
        };
        let pool = Arc::clone(first.cache.table.pool());
        for s in seqs.iter_mut() {
            if !Arc::ptr_eq(s.cache.table.pool(), &pool) {
                return Err(shape_err(
                    "attention",
                    "sequences of different KV shapes in one call".into(),
                ));
            }
            if layer >= s.cache.layout.layers() || s.cache.layout.head_dim() != shape.head_dim {
                return Err(shape_err(
                    "attention",
                    format!(
                        "layer {layer} of heads of {} against the cache's layout",
                        shape.head_dim
                    ),
                ));
            }
            let start = s.start_pos;
            s.cache.table.write(start..start + s.rows.len())?;
        }
        let ids: Vec<Vec<u32>> = seqs.iter().map(|s| s.cache.table.ids().collect()).collect();
        let plan_seqs: Vec<PlanSeq<'_>> = seqs
            .iter()
            .zip(&ids)
            .map(|(s, blocks)| PlanSeq {
                blocks,
                rows: s.rows.clone(),
                start_pos: s.start_pos,
            })
            .collect();
        let plan = plan(rows, crate::kv::KV_UNIT, &plan_seqs)?;
        let stream = self.dev.stream();
        let upload = |v: &[i32]| {
            stream
                .clone_htod(v)
                .map_err(driver_err("cuMemcpyHtoD (attention)"))
        };
        let (tables, row_seq, row_pos) = (
            upload(&plan.block_tables)?,
            upload(&plan.row_seq)?,
            upload(&plan.row_pos)?,
        );
        let int = |n: usize| {
            i32::try_from(n).map_err(|_| shape_err("attention", format!("{n} exceeds i32")))
        };
        let params = AttentionParams {
            max_blocks: int(plan.max_blocks)?,
            n_heads: int(shape.n_heads)?,
            n_kv_heads: int(shape.n_kv_heads)?,
            head_dim: int(shape.head_dim)?,
            block_positions: int(crate::kv::KV_UNIT)?,
            window: int(shape.window.unwrap_or(0))?,
            scale: shape.scale,
            softcap: shape.softcap.unwrap_or(0.0),
            ..AttentionParams::default()
        };
        ops_layers::attention(
            &self.dev,
            params,
            AttentionBuffers {
                q: q.buf()?,
                k: k.buf()?,
                v: v.buf()?,
                pool: pool.layer_address(layer),
                block_tables: &tables,
                row_seq: &row_seq,
                row_pos: &row_pos,
                out: out.buf_mut()?,
            },
        )
        .map_err(device_err)
    }
}
