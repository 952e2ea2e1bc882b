//! The matmuls: a decode step's few rows through the MMVQ kernels (the
//! rows quantized to q8_1 once for every product of the call), a prefill's
//! many rows through cuBLAS against the weights decoded to F16.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::super::gemm_pointers::{self, GemmArrays};
use super::super::ops::{self, MatvecInput};
use super::super::ops_layers::{self, WeightRef};
use super::super::step_graph::Launch;
use super::scratch::Scratch;
use super::step::{kind, op};
use super::tensors::{CudaActivations, CudaMatrix, CudaVector};
use super::{device_err, driver_err, poisoned, CudaBackend};
use crate::{DType, KernelError};

/// Rows up to this run the decode kernels (tiles of 8, 4, 2, 1 rows, each
/// reading the weights once); more decode the weights to F16 once and
/// multiply with cuBLAS. MMVQ at 32 rows reads the weights four times, the
/// F16 path writes and reads them at 2 bytes an element: about even for
/// 4-bit weights. To be tuned by `scripts/gpu-check.sh` on a GPU.
pub const DECODE_MAX_ROWS: usize = 32;

fn grow<'a, T: DeviceRepr + ValidAsZeroBits>(
    backend: &CudaBackend,
    stream: &Arc<CudaStream>,
    slot: &'a mut Option<CudaSlice<T>>,
    len: usize,
) -> Result<&'a mut CudaSlice<T>, KernelError> {
    if slot.as_ref().is_none_or(|b| b.len() < len) {
        let Some(_pass) = backend.outside_capture("a scratch allocation", None) else {
            return Err(KernelError::StepDiverged(
                "the matmul scratch must grow inside a capture".into(),
            ));
        };
        *slot = None; // free the old one first
        *slot = Some(
            stream
                .alloc_zeros::<T>(len.max(1))
                .map_err(driver_err("cuMemAlloc (matmul scratch)"))?,
        );
    }
    slot.as_mut()
        .ok_or_else(|| KernelError::Device("matmul scratch".into()))
}

/// One product of a call.
pub(super) struct Product<'a> {
    pub w: &'a CudaMatrix,
    pub bias: Option<&'a CudaVector>,
    pub out: &'a mut CudaActivations,
    pub accumulate: bool,
}

fn check(x: &CudaActivations, p: &Product<'_>) -> Result<(), KernelError> {
    let ok = x.cols == p.w.cols
        && p.out.rows == x.rows
        && p.out.cols == p.w.rows
        && p.bias.is_none_or(|b| b.len() == p.w.rows);
    if ok {
        return Ok(());
    }
    Err(KernelError::Shape {
        op: "matmul",
        detail: format!(
            "x {} · W {}×{} into out {}{}",
            x.shape(),
            p.w.rows,
            p.w.cols,
            p.out.shape(),
            p.bias
                .map_or(String::new(), |b| format!(" with a bias of {}", b.len()))
        ),
    })
}

/// How one product's launches name its weight and bias
/// (`weight_refs.rs`).
#[derive(Clone, Copy)]
struct Refs {
    weight: WeightRef,
    bias: Option<WeightRef>,
}

impl CudaBackend {
    /// Every product of `products` on the rows of `x`: up to
    /// [`DECODE_MAX_ROWS`] through the decode kernels, more through cuBLAS;
    /// either way recorded into a captured step (cuBLAS has its workspace
    /// set, so it allocates nothing inside a capture), so that a decode
    /// step of any batch replays as one graph.
    pub(super) fn products(
        &self,
        x: &CudaActivations,
        products: &mut [Product<'_>],
    ) -> Result<(), KernelError> {
        for p in products.iter() {
            check(x, p)?;
        }
        if x.rows == 0 || products.is_empty() {
            return Ok(());
        }
        // Held to the last launch (the biases), so that no capture of
        // another thread begins among them.
        let _pass = self.gate.pass();
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| poisoned("matmul scratch"))?;
        let refs = self.product_refs(products)?;
        let launch = if x.rows <= DECODE_MAX_ROWS {
            self.decode(x, products, &refs, &mut scratch)?
        } else {
            self.prefill(x, products, &refs, &mut scratch)?
        };
        if launch == Launch::Skip {
            return Ok(());
        }
        for (p, r) in products.iter_mut().zip(&refs) {
            if let Some(bias) = r.bias {
                ops_layers::add_bias(&self.dev, p.out.buf_mut()?, bias, p.w.rows)
                    .map_err(device_err)?;
            }
        }
        Ok(())
    }

    /// The weights and biases of `products` as this step names them.
    fn product_refs(&self, products: &[Product<'_>]) -> Result<Vec<Refs>, KernelError> {
        let mut held = products
            .iter()
            .map(|p| self.held_matrix(p.w))
            .collect::<Result<Vec<_>, _>>()?;
        held.extend(
            products
                .iter()
                .filter_map(|p| p.bias)
                .map(|b| self.held_vector(b)),
        );
        let refs = self.weight_refs(&held)?;
        let (weights, biases) = refs.split_at(products.len());
        let mut biases = biases.iter();
        Ok(products
            .iter()
            .zip(weights)
            .map(|(p, weight)| Refs {
                weight: *weight,
                bias: p.bias.and_then(|_| biases.next().copied()),
            })
            .collect())
    }

    /// The signature words of one product: what it reads and writes.
    fn product_words(&self, p: &Product<'_>, r: &Refs) -> Result<[u64; 8], KernelError> {
        let bias = r.bias.map_or([0, 0], |b| [b.table, u64::from(b.slot)]);
        Ok([
            r.weight.table,
            u64::from(r.weight.slot),
            u64::from(p.w.dtype.ggml_id()),
            self.addr(p.out.buf()?),
            p.w.rows as u64,
            u64::from(p.accumulate),
            bias[0],
            bias[1],
        ])
    }

    /// The decode products, or their launches skipped (a replay: the
    /// signature covers the quantization, the products and their biases).
    fn decode(
        &self,
        x: &CudaActivations,
        products: &mut [Product<'_>],
        refs: &[Refs],
        scratch: &mut Scratch,
    ) -> Result<Launch, KernelError> {
        let (n, k) = (x.rows, x.cols);
        let xs = x.buf()?;
        let stream = self.dev.stream();
        let quantized = products.iter().any(|p| p.w.dtype.is_quantized());
        if quantized {
            if !k.is_multiple_of(32) {
                return Err(KernelError::Shape {
                    op: "matmul",
                    detail: format!("quantized weights of rows of {k}, not whole blocks of 32"),
                });
            }
            grow(self, stream, &mut scratch.q, n * k)?;
            grow(self, stream, &mut scratch.ds, n * k / 16)?;
        }
        let mut sig = vec![op::MATMUL, self.addr(xs), n as u64, k as u64];
        if quantized {
            let (q, ds) = (scratch.q.as_ref(), scratch.ds.as_ref());
            sig.push(q.map_or(0, |b| self.addr(b)));
            sig.push(ds.map_or(0, |b| self.addr(b)));
        }
        for (p, r) in products.iter().zip(refs) {
            sig.extend(self.product_words(p, r)?);
        }
        if self.enter(&sig)?.launch == Launch::Skip {
            return Ok(Launch::Skip);
        }
        if let (true, Some(q), Some(ds)) = (quantized, scratch.q.as_mut(), scratch.ds.as_mut()) {
            ops::quantize_q8_1(&self.dev, xs, n, k, q, ds).map_err(device_err)?;
        }
        for (p, r) in products.iter_mut().zip(refs) {
            let input = match (&scratch.q, &scratch.ds) {
                (Some(q), Some(ds)) if p.w.dtype.is_quantized() => MatvecInput::Quantized { q, ds },
                _ => MatvecInput::Float(xs),
            };
            let (dtype, rows) = (p.w.dtype, p.w.rows);
            let out = p.out.buf_mut()?;
            ops::matvec(
                &self.dev,
                r.weight.table,
                r.weight.slot,
                dtype,
                input,
                out,
                rows,
                k,
                n,
                p.accumulate,
            )
            .map_err(device_err)?;
        }
        Ok(Launch::Run)
    }

    /// The products of many rows through cuBLAS, or their launches
    /// skipped (a replay). Quantized weights are decoded to F16 through
    /// their references; F32 and F16 weights go to cuBLAS's batched GEMM
    /// (a batch of one) whose A array is their reference's table entry
    /// (`gemm_pointers.rs`). Either way a replay reads the step's
    /// checkpoint: a swap keeps the graph.
    fn prefill(
        &self,
        x: &CudaActivations,
        products: &mut [Product<'_>],
        refs: &[Refs],
        scratch: &mut Scratch,
    ) -> Result<Launch, KernelError> {
        let (n, k) = (x.rows, x.cols);
        let xs = x.buf()?;
        let stream = self.dev.stream();
        let halves = products.iter().any(|p| p.w.dtype != DType::F32);
        // Grown before the signature, which names them.
        if halves {
            grow(self, stream, &mut scratch.x16, n * k)?;
        }
        let decoded = products
            .iter()
            .filter(|p| !matches!(p.w.dtype, DType::F32 | DType::F16))
            .map(|p| p.w.rows * k)
            .max();
        if let Some(len) = decoded {
            grow(self, stream, &mut scratch.w16, len)?;
        }
        let mut sig = vec![
            op::MATMUL_PREFILL,
            self.addr(xs),
            n as u64,
            k as u64,
            scratch.x16.as_ref().map_or(0, |b| self.addr(b)),
            scratch.w16.as_ref().map_or(0, |b| self.addr(b)),
        ];
        for (p, r) in products.iter().zip(refs) {
            sig.extend(self.product_words(p, r)?);
        }
        // The B and C pointer arrays of the float weights' GEMMs, staged
        // before `enter` (a replay stages what the capture did); their
        // contents are words of the signature already.
        let mut operands = Vec::with_capacity(products.len());
        for p in products.iter() {
            let rows_at = match p.w.dtype {
                DType::F32 => self.addr(xs),
                DType::F16 => address(stream, &scratch.x16)?,
                _ => {
                    operands.push(None);
                    continue;
                }
            };
            let bytes = gemm_pointers::operand_bytes(rows_at, self.addr(p.out.buf()?));
            operands.push(Some(self.stage(&bytes, kind::GEMM_OPERANDS)?));
        }
        if self.enter(&sig)?.launch == Launch::Skip {
            return Ok(Launch::Skip);
        }
        if let (true, Some(x16)) = (halves, scratch.x16.as_mut()) {
            ops_layers::to_f16(&self.dev, xs, x16, n * k).map_err(device_err)?;
        }
        for ((p, r), staged) in products.iter_mut().zip(refs).zip(&operands) {
            let (dtype, rows) = (p.w.dtype, p.w.rows);
            let ty = match dtype {
                DType::F32 => cudaDataType_t::CUDA_R_32F,
                _ => cudaDataType_t::CUDA_R_16F,
            };
            let gemm = Gemm {
                rows,
                n,
                k,
                ty,
                accumulate: p.accumulate,
            };
            if let Some(staged) = staged {
                let arrays = gemm_pointers::arrays(r.weight.table, r.weight.slot, staged.addr);
                self.gemm_batched(&gemm, arrays)?;
                continue;
            }
            let (a, b) = match dtype {
                DType::F32 | DType::F16 => {
                    return Err(KernelError::Device("a float weight's GEMM arrays".into()))
                }
                _ => {
                    let w16 = scratch
                        .w16
                        .as_mut()
                        .ok_or_else(|| KernelError::Device("matmul scratch missing".into()))?;
                    ops::dequant_f16(
                        &self.dev,
                        r.weight.table,
                        r.weight.slot,
                        dtype,
                        w16,
                        rows,
                        k,
                    )
                    .map_err(device_err)?;
                    (w16.device_ptr(stream).0, address(stream, &scratch.x16)?)
                }
            };
            let c = p.out.buf_mut()?.device_ptr_mut(stream).0;
            self.gemm(&gemm, a, b, c)?;
        }
        drop(operands);
        Ok(Launch::Run)
    }
}

/// One product's shape for cuBLAS: `out` (`rows × n`, column-major) =
/// Wᵀ-as-stored (`k × rows`)ᵀ · x (`k × n`), F32 accumulation and output.
struct Gemm {
    rows: usize,
    n: usize,
    k: usize,
    /// The type of W and x.
    ty: cudaDataType_t,
    accumulate: bool,
}

fn dim(v: usize) -> Result<i32, KernelError> {
    i32::try_from(v).map_err(|_| KernelError::Shape {
        op: "matmul",
        detail: format!("{v} exceeds cuBLAS's i32"),
    })
}

impl CudaBackend {
    /// `gemm` with W, x and out at `a`, `b`, `c` (`cublasGemmEx`).
    fn gemm(&self, gemm: &Gemm, a: u64, b: u64, c: u64) -> Result<(), KernelError> {
        let (alpha, beta) = (1.0f32, if gemm.accumulate { 1.0f32 } else { 0.0 });
        // SAFETY: a, b, c address rows·k, n·k and n·rows elements of the
        // stated types (checked shapes, scratch grown to fit); alpha and
        // beta are host f32 as the default pointer mode reads them (at the
        // call, also when captured).
        unsafe {
            gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                dim(gemm.rows)?,
                dim(gemm.n)?,
                dim(gemm.k)?,
                (&alpha as *const f32).cast::<c_void>(),
                a as *const c_void,
                gemm.ty,
                dim(gemm.k)?,
                b as *const c_void,
                gemm.ty,
                dim(gemm.k)?,
                (&beta as *const f32).cast::<c_void>(),
                c as *mut c_void,
                cudaDataType_t::CUDA_R_32F,
                dim(gemm.rows)?,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| KernelError::Device(format!("cublasGemmEx: {e:?}")))
    }

    /// `gemm` as a batch of one whose W, x and out addresses cuBLAS reads
    /// from the device arrays `arrays` when it runs (`gemm_pointers.rs`).
    fn gemm_batched(&self, gemm: &Gemm, arrays: GemmArrays) -> Result<(), KernelError> {
        let (alpha, beta) = (1.0f32, if gemm.accumulate { 1.0f32 } else { 0.0 });
        // SAFETY: each array is one device address, in device memory that
        // lives until the call's work is queued and, in a graph, while it
        // is replayed (the weight table, the step arena); each names a
        // buffer of the size `gemm_ex` above needs. alpha and beta as there.
        unsafe {
            cudarc::cublas::sys::cublasGemmBatchedEx(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                dim(gemm.rows)?,
                dim(gemm.n)?,
                dim(gemm.k)?,
                (&alpha as *const f32).cast::<c_void>(),
                arrays.a as *const *const c_void,
                gemm.ty,
                dim(gemm.k)?,
                arrays.b as *const *const c_void,
                gemm.ty,
                dim(gemm.k)?,
                (&beta as *const f32).cast::<c_void>(),
                arrays.c as *const *mut c_void,
                cudaDataType_t::CUDA_R_32F,
                dim(gemm.rows)?,
                1,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .result()
        .map_err(|e| KernelError::Device(format!("cublasGemmBatchedEx: {e:?}")))
    }
}

/// The device address of a scratch buffer that must exist by now.
fn address(stream: &CudaStream, buf: &Option<CudaSlice<u16>>) -> Result<u64, KernelError> {
    buf.as_ref()
        .map(|b| b.device_ptr(stream).0)
        .ok_or_else(|| KernelError::Device("matmul scratch missing".into()))
}
