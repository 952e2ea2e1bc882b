//! The [`Backend`] operations of [`CpuBackend`]: each one checks shapes and
//! hands over to its kernel module.

use std::ops::Range;
use std::sync::Arc;

use super::attention::{attention, AttentionCall};
use super::kv_store::CpuKvStore;
use super::matmul_input::Input;
use super::packed::{self, PackedRows};
use super::tensors::{CpuActivations, CpuMatrix, CpuVector};
use super::{
    activation, argmax, elementwise, lora, lora_elems, lora_q8, matmul, norm, rope, row_copy,
};
use crate::formats::dequantize_row;
use crate::kv::{BlockId, KvBlockShape};
use crate::{
    AttentionRows, AttentionShape, Backend, DType, KernelError, KvFormat, LoraRows, LoraSide,
    LoraUpdate, MatmulInput, MatmulProduct, RopeStyle, WeightView,
};

use super::cpu_backend::CpuBackend;

impl Backend for CpuBackend {
    type Matrix = CpuMatrix;
    type Vector = CpuVector;
    type Activations = CpuActivations;
    type KvStore = CpuKvStore;

    fn name(&self) -> String {
        format!("cpu-{}", self.isa.get().name())
    }

    fn matrix(&self, weight: WeightView) -> Result<CpuMatrix, KernelError> {
        // Re-check the invariant WeightView::new established, since its
        // fields are public and the kernels rely on it.
        let view = WeightView::new(weight.dtype, weight.rows, weight.cols, weight.data)?;
        let packed = if packed::packs(self.isa, view.dtype) {
            PackedRows::pack(&view, &self.arena).map(Arc::new)
        } else {
            None
        };
        Ok(CpuMatrix { view, packed })
    }

    /// The view alone, never a packed copy: the LoRA kernels read the rows
    /// as stored, BF16 tiled (`lora_elems`: the same bytes, in the order
    /// the kernels fetch and widen fastest) and Q8_0 packed for `side`'s
    /// integer kernel (`lora_q8`: the size of Q8_0, rows padded to four).
    fn lora_matrix(&self, weight: WeightView, side: LoraSide) -> Result<CpuMatrix, KernelError> {
        let view = WeightView::new(weight.dtype, weight.rows, weight.cols, weight.data)?;
        let view = match view.dtype {
            DType::BF16 => {
                let data = bytes::Bytes::from(lora_elems::tile_bf16(&view.data, view.cols));
                WeightView::new(view.dtype, view.rows, view.cols, data)?
            }
            DType::Q8_0 => lora_q8::pack(side, &view)?,
            _ => view,
        };
        Ok(CpuMatrix { view, packed: None })
    }

    fn vector(&self, values: &[f32]) -> Result<CpuVector, KernelError> {
        Ok(CpuVector {
            values: values.to_vec(),
        })
    }

    fn activations(&self, rows: usize, cols: usize) -> CpuActivations {
        CpuActivations::zeros(rows, cols)
    }

    /// Lends `x`'s own buffer: no copy (`staging` stays untouched).
    fn host_rows<'a>(&self, x: &'a CpuActivations, _staging: &'a mut Vec<f32>) -> &'a [f32] {
        x.data.get(..x.rows * x.cols).unwrap_or(&x.data)
    }

    fn argmax(&self, row: &[f32]) -> u32 {
        argmax::argmax(&self.pool, row)
    }

    fn resize(&self, x: &mut CpuActivations, rows: usize, cols: usize) {
        x.reshape(rows, cols);
    }

    /// Blocks are allocated one by one as the engine asks (host memory
    /// has no pool to set aside).
    fn kv_store(&self, _: KvFormat, _: usize) -> Result<CpuKvStore, KernelError> {
        Ok(CpuKvStore::default())
    }

    fn kv_alloc(
        &self,
        store: &mut CpuKvStore,
        shape: KvBlockShape,
    ) -> Result<BlockId, KernelError> {
        store.alloc(shape)
    }

    fn kv_free(store: &mut CpuKvStore, id: BlockId) {
        store.free(id);
    }

    fn kv_copy(
        &self,
        store: &mut CpuKvStore,
        from: BlockId,
        to: BlockId,
        positions: usize,
    ) -> Result<(), KernelError> {
        store.copy(from, to, positions)
    }

    fn embed(
        &self,
        table: &CpuMatrix,
        tokens: &[u32],
        out: &mut CpuActivations,
    ) -> Result<(), KernelError> {
        if out.rows != tokens.len() || out.cols != table.cols() {
            return Err(KernelError::Shape {
                op: "embed",
                detail: format!(
                    "{} tokens into out {} from a table of width {}",
                    tokens.len(),
                    out.shape(),
                    table.cols()
                ),
            });
        }
        let cols = out.cols;
        for (i, token) in tokens.iter().enumerate() {
            let bytes = usize::try_from(*token)
                .ok()
                .and_then(|t| table.row_bytes(t))
                .ok_or_else(|| KernelError::Shape {
                    op: "embed",
                    detail: format!(
                        "token {token} is outside the embedding table's {} rows",
                        table.rows()
                    ),
                })?;
            dequantize_row(
                table.dtype(),
                bytes,
                &mut out.data[i * cols..(i + 1) * cols],
            )?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CpuActivations,
        weight: &CpuVector,
        eps: f32,
        out: &mut CpuActivations,
    ) -> Result<(), KernelError> {
        norm::rms_norm(&self.pool, x, &weight.values, eps, out)
    }

    fn lora(
        &self,
        x: &CpuActivations,
        runs: &[LoraRows<'_, Self>],
        out: &mut CpuActivations,
    ) -> Result<(), KernelError> {
        let runs = lora_runs(runs);
        lora::lora(&self.pool, self.isa, x, &runs, out)
    }

    fn lora_many(
        &self,
        x: &CpuActivations,
        updates: &mut [LoraUpdate<'_, '_, Self>],
    ) -> Result<(), KernelError> {
        let runs: Vec<Vec<lora::Run<'_>>> = updates.iter().map(|u| lora_runs(u.runs)).collect();
        let mut updates: Vec<lora::Update<'_, '_>> = updates
            .iter_mut()
            .zip(&runs)
            .map(|(u, runs)| lora::Update {
                runs,
                out: &mut *u.out,
            })
            .collect();
        lora::lora_many(&self.pool, self.isa, x, &mut updates)
    }

    fn matmul(
        &self,
        x: &CpuActivations,
        w: &CpuMatrix,
        bias: Option<&CpuVector>,
        out: &mut CpuActivations,
    ) -> Result<(), KernelError> {
        let bias = bias.map(|b| b.values.as_slice());
        matmul::matmul(&self.pool, self.isa, x, w, bias, out)
    }

    fn matmul_many(
        &self,
        input: MatmulInput<'_, Self>,
        products: &mut [MatmulProduct<'_, Self>],
    ) -> Result<(), KernelError> {
        let input = match input {
            MatmulInput::Rows(x) => Input::Rows(x),
            MatmulInput::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => Input::RmsNorm {
                x,
                weight: &weight.values,
                eps,
                out,
            },
            MatmulInput::SiluMul { gate, up } => Input::SiluMul { gate, up },
            MatmulInput::GeluMul { gate, up } => Input::GeluMul { gate, up },
        };
        let mut list = matmul::ProductList::new();
        list.extend(products.iter_mut().map(|p| matmul::Product {
            w: p.w,
            bias: p.bias.map(|b| b.values.as_slice()),
            out: &mut *p.out,
            accumulate: p.accumulate,
        }));
        matmul::matmul_many(&self.pool, self.isa, input, &mut list)
    }

    fn rope(
        &self,
        x: &mut CpuActivations,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        style: RopeStyle,
    ) -> Result<(), KernelError> {
        rope::rope(&self.pool, x, head_dim, positions, inv_freq, style)
    }

    fn attention(
        &self,
        layer: usize,
        shape: AttentionShape,
        q: &CpuActivations,
        k: &CpuActivations,
        v: &CpuActivations,
        store: &mut CpuKvStore,
        seqs: &[AttentionRows<'_>],
        out: &mut CpuActivations,
    ) -> Result<(), KernelError> {
        let call = AttentionCall {
            layer,
            shape,
            q,
            k,
            v,
            products: self.attention,
        };
        attention(&self.pool, self.isa, call, store, seqs, out)
    }

    fn silu_mul(&self, gate: &mut CpuActivations, up: &CpuActivations) -> Result<(), KernelError> {
        elementwise::silu_mul(&self.pool, self.isa, gate, up)
    }

    fn gelu_mul(&self, gate: &mut CpuActivations, up: &CpuActivations) -> Result<(), KernelError> {
        activation::gelu_mul(&self.pool, self.isa, gate, up)
    }

    fn scale(&self, x: &mut CpuActivations, factor: f32) -> Result<(), KernelError> {
        activation::map(&self.pool, x, |v| v * factor);
        Ok(())
    }

    fn softcap(&self, x: &mut CpuActivations, cap: f32) -> Result<(), KernelError> {
        activation::map(&self.pool, x, |v| cap * (v / cap).tanh());
        Ok(())
    }

    fn rms_norm_heads(
        &self,
        x: &mut CpuActivations,
        weight: &CpuVector,
        eps: f32,
    ) -> Result<(), KernelError> {
        norm::rms_norm_heads(&self.pool, x, &weight.values, eps)
    }

    fn add(&self, x: &mut CpuActivations, y: &CpuActivations) -> Result<(), KernelError> {
        elementwise::add(&self.pool, x, y)
    }

    fn copy_rows(
        &self,
        src: &CpuActivations,
        rows: Range<usize>,
        dst: &mut CpuActivations,
        dst_row: usize,
    ) -> Result<(), KernelError> {
        row_copy::copy_rows(src, rows, dst, dst_row)
    }
}

/// The backend's runs as the kernel's (the views inside the matrices).
fn lora_runs<'a>(runs: &'a [LoraRows<'a, CpuBackend>]) -> Vec<lora::Run<'a>> {
    runs.iter()
        .map(|r| lora::Run {
            rows: r.rows.clone(),
            a: &r.a.view,
            b_t: &r.b_t.view,
            scale: r.scale,
        })
        .collect()
}
