//! The backend trait on [`CudaBackend`]: shape checks, then the launches
//! of `ops.rs` and `ops_layers.rs`.

use std::ops::Range;

use cudarc::driver::CudaSlice;

use super::super::buffer::CudaMemory;
use super::super::kernel_names;
use super::super::ops;
use super::super::ops_layers::{self, Elementwise};
use super::super::step_arena::{bytes_of, bytes_of_f32};
use super::super::step_graph::Launch;
use super::super::weight_tiers::TieredWeight;
use super::products::Product;
use super::step::{kind, op};
use super::tensors::{CudaActivations, CudaKvStore, CudaMatrix, CudaVector};
use super::{device_err, driver_err, CudaBackend};
use crate::kv::{BlockId, KvBlockShape};
use crate::{
    AttentionRows, AttentionShape, Backend, KernelError, KvFormat, MatmulInput, MatmulProduct,
    RopeStyle, StepKey, WeightTier, WeightView,
};

fn mismatch(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

fn same_shape(
    op: &'static str,
    x: &CudaActivations,
    y: &CudaActivations,
) -> Result<(), KernelError> {
    if x.rows != y.rows || x.cols != y.cols {
        return Err(mismatch(op, format!("{} against {}", x.shape(), y.shape())));
    }
    Ok(())
}

impl CudaBackend {
    fn alloc_f32(&self, len: usize) -> Result<CudaSlice<f32>, String> {
        let Some(_pass) = self.outside_capture("an activation allocation", None) else {
            return Err("an activation allocated inside a captured step".into());
        };
        self.dev
            .stream()
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|e| format!("activations of {len} floats: {e:?} (device memory exhausted?)"))
    }

    fn elementwise(&self, x: &mut CudaActivations, op: Elementwise<'_>) -> Result<(), KernelError> {
        if x.len() == 0 {
            return Ok(());
        }
        let (which, arg) = match &op {
            Elementwise::SiluMul(y) => (1, self.addr(y)),
            Elementwise::GeluMul(y) => (2, self.addr(y)),
            Elementwise::Add(y) => (3, self.addr(y)),
            Elementwise::Scale(f) => (4, u64::from(f.to_bits())),
            Elementwise::Softcap(f) => (5, u64::from(f.to_bits())),
        };
        let sig = [
            op::ELEMENTWISE,
            which,
            self.addr(x.buf()?),
            arg,
            x.len() as u64,
        ];
        let entered = self.enter(&sig)?;
        if entered.launch == Launch::Skip {
            return Ok(());
        }
        ops_layers::elementwise(&self.dev, x.buf_mut()?, op).map_err(device_err)
    }

    fn upload<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> Result<CudaSlice<T>, KernelError> {
        let _pass = self.gate.pass();
        self.dev
            .stream()
            .clone_htod(v)
            .map_err(driver_err("cuMemcpyHtoD"))
    }
}

impl Backend for CudaBackend {
    type Matrix = CudaMatrix;
    type Vector = CudaVector;
    type Activations = CudaActivations;
    type KvStore = CudaKvStore;

    const DEVICE_MEMORY: bool = true;

    fn name(&self) -> String {
        let (major, minor) = self.dev.capability();
        format!("cuda-sm_{major}{minor}")
    }

    fn weight_tier(&self, weights: &[&CudaMatrix]) -> WeightTier {
        // A failure to look reads as host memory: the engine prefetches
        // then, and the prefetch says what failed.
        self.tiers
            .tier(&tiered(weights))
            .unwrap_or(WeightTier::Host)
    }

    fn demote(&self, weights: &[&CudaMatrix]) -> Result<bool, KernelError> {
        self.tiers.demote(&tiered(weights)).map_err(device_err)
    }

    fn prefetch(&self, weights: &[&CudaMatrix]) -> Result<WeightTier, KernelError> {
        self.tiers.prefetch(&tiered(weights)).map_err(device_err)
    }

    fn host_tier_bytes(&self) -> u64 {
        self.tiers.host_used() as u64
    }

    fn matrix(&self, weight: WeightView) -> Result<CudaMatrix, KernelError> {
        let tiered = self.tiers.upload(&weight.data).map_err(device_err)?;
        Ok(CudaMatrix {
            weight: std::mem::ManuallyDrop::new(tiered),
            gate: std::sync::Arc::clone(&self.gate),
            dtype: weight.dtype,
            rows: weight.rows,
            cols: weight.cols,
        })
    }

    fn vector(&self, values: &[f32]) -> Result<CudaVector, KernelError> {
        let buf = self.upload(values)?;
        let slot = self
            .tiers
            .table()
            .insert(self.addr(&buf))
            .map_err(device_err)?;
        Ok(CudaVector {
            slot: std::mem::ManuallyDrop::new(slot),
            buf: std::mem::ManuallyDrop::new(buf),
            gate: std::sync::Arc::clone(&self.gate),
        })
    }

    fn activations(&self, rows: usize, cols: usize) -> CudaActivations {
        CudaActivations {
            buf: self.alloc_f32(rows * cols),
            rows,
            cols,
        }
    }

    fn host_rows<'a>(&self, x: &'a CudaActivations, staging: &'a mut Vec<f32>) -> &'a [f32] {
        let _pass = self.gate.pass();
        let n = x.len();
        staging.clear();
        staging.resize(n, f32::NAN);
        let copied = x.buf().and_then(|buf| {
            let stream = self.dev.stream();
            stream
                .memcpy_dtoh(&buf.slice(0..n), staging.as_mut_slice())
                .and_then(|()| stream.synchronize())
                .map_err(driver_err("cuMemcpyDtoH (host_rows)"))
        });
        // The trait gives no way to fail here: NaN rows sample nothing
        // sensible, and the error is logged where an operator looks.
        if let Err(e) = copied {
            tracing::error!("cuda: reading activations back failed: {e}");
            staging.fill(f32::NAN);
        }
        staging.as_slice()
    }

    fn resize(&self, x: &mut CudaActivations, rows: usize, cols: usize) {
        if rows * cols != x.len() || x.buf.is_err() {
            // Free before allocating, outside any capture.
            let old = std::mem::replace(&mut x.buf, Err(String::new())).ok();
            x.buf = match self.outside_capture("an activation reallocation", old) {
                Some(pass) => {
                    drop(pass);
                    self.alloc_f32(rows * cols)
                }
                None => Err("an activation reallocated inside a captured step".into()),
            };
        }
        x.rows = rows;
        x.cols = cols;
    }

    fn begin_step(&self, key: Option<StepKey>) {
        self.begin(key);
    }

    fn end_step(&self) -> Result<(), KernelError> {
        self.end()
    }

    fn abort_step(&self) {
        self.abort();
    }

    fn kv_store(&self, format: KvFormat, budget_bytes: usize) -> Result<CudaKvStore, KernelError> {
        CudaKvStore::new(self.memory.clone(), format, budget_bytes)
    }

    fn kv_alloc(
        &self,
        store: &mut CudaKvStore,
        shape: KvBlockShape,
    ) -> Result<BlockId, KernelError> {
        if kernel_names::attention(shape.head_dim).is_none() {
            return Err(mismatch(
                "kv_alloc",
                format!(
                    "the CUDA attention kernels take heads of 64, 128 or 256, not {}",
                    shape.head_dim
                ),
            ));
        }
        store.alloc(shape)
    }

    fn kv_free(store: &mut CudaKvStore, id: BlockId) {
        store.free(id);
    }

    fn kv_copy(
        &self,
        store: &mut CudaKvStore,
        from: BlockId,
        to: BlockId,
        positions: usize,
    ) -> Result<(), KernelError> {
        store.copy(from, to, positions)
    }

    fn embed(
        &self,
        table: &CudaMatrix,
        tokens: &[u32],
        out: &mut CudaActivations,
    ) -> Result<(), KernelError> {
        if out.rows != tokens.len() || out.cols != table.cols {
            return Err(mismatch(
                "embed",
                format!(
                    "{} tokens into out {} from a table of width {}",
                    tokens.len(),
                    out.shape(),
                    table.cols
                ),
            ));
        }
        if let Some(t) = tokens.iter().find(|t| **t as usize >= table.rows) {
            return Err(mismatch(
                "embed",
                format!("token {t} of a table of {} rows", table.rows),
            ));
        }
        if tokens.is_empty() {
            return Ok(());
        }
        let ids = self.stage(&bytes_of(tokens), kind::TOKENS)?;
        let weight = self.weight_ref(self.held_matrix(table)?)?;
        let (cols, n) = (table.cols, tokens.len());
        let sig = [
            op::EMBED,
            weight.table,
            u64::from(weight.slot),
            u64::from(table.dtype.ggml_id()),
            ids.addr,
            n as u64,
            self.addr(out.buf()?),
            cols as u64,
        ];
        let entered = self.enter(&sig)?;
        if entered.launch == Launch::Skip {
            return Ok(());
        }
        ops::embed(
            &self.dev,
            weight.table,
            weight.slot,
            table.dtype,
            ids.addr,
            n,
            out.buf_mut()?,
            cols,
        )
        .map_err(device_err)
    }

    fn rms_norm(
        &self,
        x: &CudaActivations,
        weight: &CudaVector,
        eps: f32,
        out: &mut CudaActivations,
    ) -> Result<(), KernelError> {
        same_shape("rms_norm", x, out)?;
        if weight.len() != x.cols {
            return Err(mismatch(
                "rms_norm",
                format!("a weight of {} for rows of {}", weight.len(), x.cols),
            ));
        }
        if x.len() == 0 {
            return Ok(());
        }
        let (rows, cols) = (x.rows, x.cols);
        let w = self.weight_ref(self.held_vector(weight))?;
        let sig = [
            op::RMS_NORM,
            self.addr(x.buf()?),
            w.table,
            u64::from(w.slot),
            u64::from(eps.to_bits()),
            self.addr(out.buf()?),
            rows as u64,
            cols as u64,
        ];
        let entered = self.enter(&sig)?;
        if entered.launch == Launch::Skip {
            return Ok(());
        }
        ops_layers::rms_norm(&self.dev, x.buf()?, w, eps, out.buf_mut()?, rows, cols)
            .map_err(device_err)
    }

    fn matmul(
        &self,
        x: &CudaActivations,
        w: &CudaMatrix,
        bias: Option<&CudaVector>,
        out: &mut CudaActivations,
    ) -> Result<(), KernelError> {
        self.products(
            x,
            &mut [Product {
                w,
                bias,
                out,
                accumulate: false,
            }],
        )
    }

    fn matmul_many(
        &self,
        input: MatmulInput<'_, Self>,
        products: &mut [MatmulProduct<'_, Self>],
    ) -> Result<(), KernelError> {
        let x: &CudaActivations = match input {
            MatmulInput::Rows(x) => x,
            MatmulInput::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => {
                self.rms_norm(x, weight, eps, out)?;
                out
            }
            MatmulInput::SiluMul { gate, up } => {
                self.silu_mul(gate, up)?;
                gate
            }
            MatmulInput::GeluMul { gate, up } => {
                self.gelu_mul(gate, up)?;
                gate
            }
        };
        let mut own: Vec<Product<'_>> = products
            .iter_mut()
            .map(|p| Product {
                w: p.w,
                bias: p.bias,
                out: &mut *p.out,
                accumulate: p.accumulate,
            })
            .collect();
        self.products(x, &mut own)
    }

    fn rope(
        &self,
        x: &mut CudaActivations,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        style: RopeStyle,
    ) -> Result<(), KernelError> {
        let ok = positions.len() == x.rows
            && head_dim > 0
            && head_dim.is_multiple_of(2)
            && x.cols.is_multiple_of(head_dim)
            && inv_freq.len() == head_dim / 2;
        if !ok {
            return Err(mismatch(
                "rope",
                format!(
                    "x {} with {} positions, heads of {head_dim}, {} frequencies",
                    x.shape(),
                    positions.len(),
                    inv_freq.len()
                ),
            ));
        }
        if x.len() == 0 {
            return Ok(());
        }
        let pos = self.stage(&bytes_of(positions), kind::POSITIONS)?;
        let freq = self.stage(&bytes_of_f32(inv_freq), kind::FREQUENCIES)?;
        let (width, rows) = (x.cols, x.rows);
        let sig = [
            op::ROPE,
            self.addr(x.buf()?),
            width as u64,
            head_dim as u64,
            pos.addr,
            rows as u64,
            freq.addr,
            u64::from(style == RopeStyle::Neox),
        ];
        let entered = self.enter(&sig)?;
        if entered.launch == Launch::Skip {
            return Ok(());
        }
        ops_layers::rope(
            &self.dev,
            x.buf_mut()?,
            width,
            head_dim,
            pos.addr,
            rows,
            freq.addr,
            style,
        )
        .map_err(device_err)
    }

    fn attention(
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
        self.attend(layer, shape, q, k, v, store, seqs, out)
    }

    fn silu_mul(
        &self,
        gate: &mut CudaActivations,
        up: &CudaActivations,
    ) -> Result<(), KernelError> {
        same_shape("silu_mul", gate, up)?;
        self.elementwise(gate, Elementwise::SiluMul(up.buf()?))
    }

    fn gelu_mul(
        &self,
        gate: &mut CudaActivations,
        up: &CudaActivations,
    ) -> Result<(), KernelError> {
        same_shape("gelu_mul", gate, up)?;
        self.elementwise(gate, Elementwise::GeluMul(up.buf()?))
    }

    fn scale(&self, x: &mut CudaActivations, factor: f32) -> Result<(), KernelError> {
        self.elementwise(x, Elementwise::Scale(factor))
    }

    fn softcap(&self, x: &mut CudaActivations, cap: f32) -> Result<(), KernelError> {
        self.elementwise(x, Elementwise::Softcap(cap))
    }

    fn rms_norm_heads(
        &self,
        x: &mut CudaActivations,
        weight: &CudaVector,
        eps: f32,
    ) -> Result<(), KernelError> {
        let head_dim = weight.len();
        if head_dim == 0 || !x.cols.is_multiple_of(head_dim) {
            return Err(mismatch(
                "rms_norm_heads",
                format!("heads of {head_dim} in rows of {}", x.cols),
            ));
        }
        if x.len() == 0 {
            return Ok(());
        }
        let (rows, heads) = (x.rows, x.cols / head_dim);
        let w = self.weight_ref(self.held_vector(weight))?;
        let sig = [
            op::RMS_NORM_HEADS,
            self.addr(x.buf()?),
            w.table,
            u64::from(w.slot),
            u64::from(eps.to_bits()),
            rows as u64,
            heads as u64,
            head_dim as u64,
        ];
        let entered = self.enter(&sig)?;
        if entered.launch == Launch::Skip {
            return Ok(());
        }
        ops_layers::rms_norm_heads(&self.dev, x.buf_mut()?, w, eps, rows, heads, head_dim)
            .map_err(device_err)
    }

    fn add(&self, x: &mut CudaActivations, y: &CudaActivations) -> Result<(), KernelError> {
        same_shape("add", x, y)?;
        self.elementwise(x, Elementwise::Add(y.buf()?))
    }

    fn copy_rows(
        &self,
        src: &CudaActivations,
        rows: Range<usize>,
        dst: &mut CudaActivations,
        dst_row: usize,
    ) -> Result<(), KernelError> {
        let cols = src.cols;
        let ok = dst.cols == cols
            && rows.start <= rows.end
            && rows.end <= src.rows
            && dst_row + rows.len() <= dst.rows;
        if !ok {
            return Err(mismatch(
                "copy_rows",
                format!(
                    "rows {rows:?} of {} to row {dst_row} of {}",
                    src.shape(),
                    dst.shape()
                ),
            ));
        }
        if rows.is_empty() || cols == 0 {
            return Ok(());
        }
        let float = std::mem::size_of::<f32>() as u64;
        let sig = [
            op::COPY_ROWS,
            self.addr(src.buf()?) + (rows.start * cols) as u64 * float,
            self.addr(dst.buf()?) + (dst_row * cols) as u64 * float,
            (rows.len() * cols) as u64,
        ];
        let entered = self.enter(&sig)?;
        if entered.launch == Launch::Skip {
            return Ok(());
        }
        let from = src.buf()?.slice(rows.start * cols..rows.end * cols);
        let at = dst_row * cols;
        let mut to = dst.buf_mut()?.slice_mut(at..at + rows.len() * cols);
        self.dev
            .stream()
            .memcpy_dtod(&from, &mut to)
            .map_err(driver_err("cuMemcpyDtoD (copy_rows)"))
    }
}

/// The tier bookkeeping's handles of `weights`.
fn tiered<'a>(weights: &[&'a CudaMatrix]) -> Vec<&'a TieredWeight<CudaMemory>> {
    weights.iter().map(|m| &*m.weight).collect()
}
