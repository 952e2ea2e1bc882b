//! Launches of the per-layer kernels (norms, RoPE, gated activations,
//! elementwise steps, softmax, the KV write and paged attention), as
//! `ops.rs` does for the matmuls. Shapes are the caller's to validate;
//! each launch states what its buffers must hold.

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::device::CudaDevice;
use super::error::driver;
use super::kernel_names;
use super::sources::KernelModule;
use super::CudaError;
use crate::RopeStyle;

fn launch_cfg(grid: (usize, usize), block: u32) -> Result<LaunchConfig, CudaError> {
    let dim =
        |n: usize| u32::try_from(n).map_err(|_| CudaError::Layout(format!("grid of {n} blocks")));
    Ok(LaunchConfig {
        grid_dim: (dim(grid.0)?, dim(grid.1)?, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn i32_of(n: usize) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Layout(format!("{n} exceeds i32")))
}

/// A weight vector as the kernels name it: slot `slot` of the pointer
/// table at device address `table` (`sy_weights.cuh`), never its own
/// address, so that a captured launch runs whichever checkpoint the table
/// names when it replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightRef {
    pub table: u64,
    pub slot: u32,
}

/// A one-slot pointer table naming `v`, for launches outside a backend
/// (the GPU check's): the table must live while launches read it.
pub fn table_of(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    v: &CudaSlice<f32>,
) -> Result<(CudaSlice<u64>, WeightRef), CudaError> {
    let table = stream
        .clone_htod(&[v.device_ptr(stream).0])
        .map_err(driver("cuMemcpyHtoD (a weight table)"))?;
    let r = WeightRef {
        table: table.device_ptr(stream).0,
        slot: 0,
    };
    Ok((table, r))
}

/// `out = x / rms(x) · weight` per row (`x`, `out`: `rows × cols`;
/// `weight`: `cols` floats).
pub fn rms_norm(
    dev: &CudaDevice,
    x: &CudaSlice<f32>,
    weight: WeightRef,
    eps: f32,
    out: &mut CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), CudaError> {
    let f = dev.function(KernelModule::Norm, "sy_rms_norm")?;
    let cols = i32_of(cols)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x)
        .arg(&weight.table)
        .arg(&weight.slot)
        .arg(&eps)
        .arg(out)
        .arg(&cols);
    // SAFETY: x and out hold rows·cols floats, the weight cols (the
    // caller's check).
    unsafe { l.launch(launch_cfg((rows, 1), 256)?) }.map_err(driver("sy_rms_norm"))?;
    Ok(())
}

/// Each `head_dim`-wide head of `x` (`rows × heads·head_dim`) normalised
/// in place (`weight`: `head_dim` floats).
pub fn rms_norm_heads(
    dev: &CudaDevice,
    x: &mut CudaSlice<f32>,
    weight: WeightRef,
    eps: f32,
    rows: usize,
    heads: usize,
    head_dim: usize,
) -> Result<(), CudaError> {
    let f = dev.function(KernelModule::Norm, "sy_rms_norm_heads")?;
    let (h, d) = (i32_of(heads)?, i32_of(head_dim)?);
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x)
        .arg(&weight.table)
        .arg(&weight.slot)
        .arg(&eps)
        .arg(&h)
        .arg(&d);
    // SAFETY: x holds rows·heads·head_dim floats, the weight head_dim
    // (the caller's check).
    unsafe { l.launch(launch_cfg((heads.div_ceil(4), rows), 128)?) }
        .map_err(driver("sy_rms_norm_heads"))?;
    Ok(())
}

/// RoPE in place on `x` (`positions.len() × width`).
///
/// `positions` is the device address of `rows` u32 and `inv_freq` of
/// `head_dim / 2` f32 (staged inputs: see `step_arena.rs`).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    dev: &CudaDevice,
    x: &mut CudaSlice<f32>,
    width: usize,
    head_dim: usize,
    positions: u64,
    rows: usize,
    inv_freq: u64,
    style: RopeStyle,
) -> Result<(), CudaError> {
    if x.len() < rows * width {
        return Err(CudaError::Layout(format!(
            "rope: {rows}×{width} in a buffer of {}",
            x.len()
        )));
    }
    let f = dev.function(KernelModule::Rope, "sy_rope")?;
    let (w, d) = (i32_of(width)?, i32_of(head_dim)?);
    let neox = i32::from(style == RopeStyle::Neox);
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x)
        .arg(&w)
        .arg(&d)
        .arg(&positions)
        .arg(&inv_freq)
        .arg(&neox);
    // SAFETY: x holds rows·width floats (checked); the caller staged rows
    // positions and head_dim/2 frequencies at those addresses.
    unsafe { l.launch(launch_cfg(((width / 2).div_ceil(256), rows), 256)?) }
        .map_err(driver("sy_rope"))?;
    Ok(())
}

/// An elementwise step of `elementwise.cu` over `n` floats:
/// `sy_silu_mul`/`sy_gelu_mul`/`sy_add` take `y`, `sy_scale`/`sy_softcap`
/// a factor.
pub enum Elementwise<'a> {
    SiluMul(&'a CudaSlice<f32>),
    GeluMul(&'a CudaSlice<f32>),
    Add(&'a CudaSlice<f32>),
    Scale(f32),
    Softcap(f32),
}

pub fn elementwise(
    dev: &CudaDevice,
    x: &mut CudaSlice<f32>,
    op: Elementwise<'_>,
) -> Result<(), CudaError> {
    let n = x.len();
    let name = match op {
        Elementwise::SiluMul(_) => "sy_silu_mul",
        Elementwise::GeluMul(_) => "sy_gelu_mul",
        Elementwise::Add(_) => "sy_add",
        Elementwise::Scale(_) => "sy_scale",
        Elementwise::Softcap(_) => "sy_softcap",
    };
    let f = dev.function(KernelModule::Elementwise, name)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x);
    let factor;
    match &op {
        Elementwise::SiluMul(y) | Elementwise::GeluMul(y) | Elementwise::Add(y) => {
            if y.len() < n {
                return Err(CudaError::Layout(format!(
                    "{name}: y has {} of {n} floats",
                    y.len()
                )));
            }
            l.arg(*y);
        }
        Elementwise::Scale(v) | Elementwise::Softcap(v) => {
            factor = *v;
            l.arg(&factor);
        }
    }
    l.arg(&n);
    // SAFETY: x (and y, checked) hold n floats.
    unsafe { l.launch(launch_cfg((n.div_ceil(256), 1), 256)?) }.map_err(driver(name))?;
    Ok(())
}

/// Softmax of each `cols`-wide row of `x` in place, logits scaled by
/// `1/temperature` first.
pub fn softmax(
    dev: &CudaDevice,
    x: &mut CudaSlice<f32>,
    cols: usize,
    temperature: f32,
) -> Result<(), CudaError> {
    let f = dev.function(KernelModule::Softmax, "sy_softmax")?;
    let rows = x.len() / cols.max(1);
    let (c, inv) = (i32_of(cols)?, 1.0 / temperature);
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(&c).arg(&inv);
    // SAFETY: x holds rows·cols floats.
    unsafe { l.launch(launch_cfg((rows, 1), 256)?) }.map_err(driver("sy_softmax"))?;
    Ok(())
}

/// `bias` (`cols` floats, the caller's check) added to every row of `x`.
pub fn add_bias(
    dev: &CudaDevice,
    x: &mut CudaSlice<f32>,
    bias: WeightRef,
    cols: usize,
) -> Result<(), CudaError> {
    let n = x.len();
    if cols == 0 {
        return Err(CudaError::Layout("sy_add_bias: rows of 0".into()));
    }
    let f = dev.function(KernelModule::Elementwise, "sy_add_bias")?;
    let c = i32_of(cols)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(&bias.table).arg(&bias.slot).arg(&c).arg(&n);
    // SAFETY: x holds n floats, the bias cols.
    unsafe { l.launch(launch_cfg((n.div_ceil(256), 1), 256)?) }.map_err(driver("sy_add_bias"))?;
    Ok(())
}

/// The first `n` floats of `x` rounded to F16 bits in `out`.
pub fn to_f16(
    dev: &CudaDevice,
    x: &CudaSlice<f32>,
    out: &mut CudaSlice<u16>,
    n: usize,
) -> Result<(), CudaError> {
    if x.len() < n || out.len() < n {
        return Err(CudaError::Layout(format!(
            "sy_f32_to_f16: {n} floats from {} into {}",
            x.len(),
            out.len()
        )));
    }
    let f = dev.function(KernelModule::Elementwise, "sy_f32_to_f16")?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(out).arg(&n);
    // SAFETY: x and out hold n elements (checked).
    unsafe { l.launch(launch_cfg((n.div_ceil(256), 1), 256)?) }.map_err(driver("sy_f32_to_f16"))?;
    Ok(())
}

/// `attention.cu`'s `SyAttention`, field for field (8 pointers, 6 i32, 2 f32).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub pool: u64,
    pub block_tables: u64,
    pub row_seq: u64,
    pub row_pos: u64,
    pub out: u64,
    pub max_blocks: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub block_positions: i32,
    /// 0: no window.
    pub window: i32,
    pub scale: f32,
    /// 0: no cap.
    pub softcap: f32,
}

// SAFETY: plain old data laid out as the kernel's struct.
unsafe impl DeviceRepr for AttentionParams {}

/// The buffers of one attention call.
pub struct AttentionBuffers<'a> {
    pub q: &'a CudaSlice<f32>,
    pub k: &'a CudaSlice<f32>,
    pub v: &'a CudaSlice<f32>,
    /// The layer's KV blocks (`KvPool::layer_address`): written by the
    /// KV-write kernel, read by attention.
    pub pool: u64,
    /// Device addresses of the plan's tables (`attention_plan.rs`), staged
    /// for the step: `seqs × max_blocks`, then `rows` each.
    pub block_tables: u64,
    pub row_seq: u64,
    pub row_pos: u64,
    pub rows: usize,
    pub out: &'a mut CudaSlice<f32>,
}

/// Writes the rows' keys and values into their KV blocks, then attends:
/// `params`' shape fields are the caller's; the pointers are filled here.
/// The caller guarantees every row's positions have blocks in its table.
pub fn attention(
    dev: &CudaDevice,
    shape: AttentionParams,
    b: AttentionBuffers<'_>,
) -> Result<(), CudaError> {
    let head_dim = usize::try_from(shape.head_dim).unwrap_or(0);
    let name = kernel_names::attention(head_dim).ok_or_else(|| {
        CudaError::Layout(format!("no attention kernel for head size {head_dim}"))
    })?;
    let stream = dev.stream();
    let rows = b.rows;
    let kv_width = usize::try_from(shape.n_kv_heads).unwrap_or(0) * head_dim;
    let heads = usize::try_from(shape.n_heads).unwrap_or(0);
    // Raw addresses: everything runs on the one stream, in order.
    let p = AttentionParams {
        q: b.q.device_ptr(stream).0,
        k: b.k.device_ptr(stream).0,
        v: b.v.device_ptr(stream).0,
        pool: b.pool,
        block_tables: b.block_tables,
        row_seq: b.row_seq,
        row_pos: b.row_pos,
        out: b.out.device_ptr(stream).0,
        ..shape
    };
    let write = dev.function(KernelModule::Attention, "sy_kv_write_f16")?;
    let mut l = stream.launch_builder(&write);
    l.arg(&p);
    // SAFETY: k, v hold rows·kv_width floats; the tables map every row's
    // position to a block of the pool, which lives for the call (the
    // caller holds its leases).
    unsafe { l.launch(launch_cfg((kv_width.div_ceil(256), rows), 256)?) }
        .map_err(driver("sy_kv_write_f16"))?;
    let attend = dev.function(KernelModule::Attention, name)?;
    let mut l = stream.launch_builder(&attend);
    l.arg(&p);
    // SAFETY: q and out hold rows·n_heads·head_dim floats; as above.
    unsafe { l.launch(launch_cfg((heads, rows), 128)?) }.map_err(driver(name))?;
    Ok(())
}
