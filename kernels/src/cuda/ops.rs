//! Launches of the kernels of `kernels/cuda/`, with the grid shapes each
//! expects: the one place a launch configuration is written, for the GPU
//! check now and the backend (after the backend trait's redesign) later.
//! Weights are named by the pointer table's device address and a slot.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::device::CudaDevice;
use super::error::driver;
use super::kernel_names;
use super::sources::KernelModule;
use super::CudaError;
use crate::DType;

/// Activation rows of a decode matmul, as its kernel takes them.
pub enum MatvecInput<'a> {
    /// For quantized weights: `q` (`n × k` i8) and `ds` (`n × k/32 × (d, s)`)
    /// from [`quantize_q8_1`].
    Quantized {
        q: &'a CudaSlice<i8>,
        ds: &'a CudaSlice<f32>,
    },
    /// For F32/F16/BF16 weights: the f32 rows.
    Float(&'a CudaSlice<f32>),
}

fn cfg(grid: (u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn dim(n: usize, what: &'static str) -> Result<u32, CudaError> {
    u32::try_from(n)
        .map_err(|_| CudaError::Layout(format!("{what} of {n} exceeds a grid dimension")))
}

fn int(n: usize, what: &'static str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Layout(format!("{what} of {n} exceeds i32")))
}

fn short(what: &str, need: usize) -> CudaError {
    CudaError::Layout(format!("`{what}` holds fewer than {need} elements"))
}

/// `x` (`rows × k` f32, k a multiple of 32) quantized per block of 32.
pub fn quantize_q8_1(
    dev: &CudaDevice,
    x: &CudaSlice<f32>,
    rows: usize,
    k: usize,
    q: &mut CudaSlice<i8>,
    ds: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    if !k.is_multiple_of(32) || x.len() < rows * k || q.len() < rows * k || ds.len() < rows * k / 16
    {
        return Err(CudaError::Layout(format!(
            "quantize_q8_1: {rows}×{k} (k a multiple of 32) against x {}, q {}, ds {}",
            x.len(),
            q.len(),
            ds.len()
        )));
    }
    let f = dev.function(KernelModule::Quantize, "sy_quantize_q8_1")?;
    let k_arg = int(k, "k")?;
    let mut launch = dev.stream().launch_builder(&f);
    launch.arg(x).arg(q).arg(ds).arg(&k_arg);
    // SAFETY: the kernel reads rows·k floats and writes rows·k quants and
    // rows·k/16 scales; the caller sized the buffers so.
    unsafe {
        launch.launch(cfg(
            (dim((k / 32).div_ceil(4), "blocks")?, dim(rows, "rows")?),
            128,
        ))
    }
    .map_err(driver("sy_quantize_q8_1"))?;
    Ok(())
}

/// `out[r · rows + row] (+)= W[row] · a[r]` for `n` activation rows, `W`
/// (`rows × k` of `dtype`) at slot `slot` of the pointer table at `table`.
#[allow(clippy::too_many_arguments)]
pub fn matvec(
    dev: &CudaDevice,
    table: u64,
    slot: u32,
    dtype: DType,
    input: MatvecInput<'_>,
    out: &mut CudaSlice<f32>,
    rows: usize,
    k: usize,
    n: usize,
    accumulate: bool,
) -> Result<(), CudaError> {
    let (rows_arg, k_arg, acc) = (int(rows, "rows")?, int(k, "k")?, i32::from(accumulate));
    let grid = dim(rows.div_ceil(4), "rows")?;
    let mut r0 = 0;
    while r0 < n {
        let tile = kernel_names::tile_for(n - r0);
        let (module, name) = kernel_names::matvec(dtype, tile).ok_or(CudaError::NoKernelFor {
            op: "matvec",
            dtype,
        })?;
        let f = dev.function(module, &name)?;
        let mut o = out
            .try_slice_mut(r0 * rows..(r0 + tile) * rows)
            .ok_or_else(|| short("out", n * rows))?;
        let mut launch = dev.stream().launch_builder(&f);
        launch.arg(&table).arg(&slot);
        let (qa, ads, x);
        match &input {
            MatvecInput::Quantized { q, ds } if dtype.is_quantized() => {
                qa = q
                    .try_slice(r0 * k..(r0 + tile) * k)
                    .ok_or_else(|| short("q", n * k))?;
                ads = ds
                    .try_slice(r0 * k / 16..(r0 + tile) * k / 16)
                    .ok_or_else(|| short("ds", n * k / 16))?;
                launch.arg(&qa).arg(&ads);
            }
            MatvecInput::Float(xs) if !dtype.is_quantized() => {
                x = xs
                    .try_slice(r0 * k..(r0 + tile) * k)
                    .ok_or_else(|| short("x", n * k))?;
                launch.arg(&x);
            }
            _ => {
                return Err(CudaError::NoKernelFor {
                    op: "matvec (input kind)",
                    dtype,
                })
            }
        }
        launch.arg(&mut o).arg(&rows_arg).arg(&k_arg).arg(&acc);
        // SAFETY: the slices bound every access the kernel makes for `tile`
        // rows; the table's slot holds a `rows × k` matrix of `dtype`.
        unsafe { launch.launch(cfg((grid, 1), 128)) }.map_err(driver("matvec"))?;
        r0 += tile;
    }
    Ok(())
}

/// Rows `tokens` (the device address of `n` u32) of the `dtype` matrix
/// (`cols` wide) at `slot`, decoded to f32 into `out` (`n × cols`).
#[allow(clippy::too_many_arguments)]
pub fn embed(
    dev: &CudaDevice,
    table: u64,
    slot: u32,
    dtype: DType,
    tokens: u64,
    n: usize,
    out: &mut CudaSlice<f32>,
    cols: usize,
) -> Result<(), CudaError> {
    if out.len() < n * cols {
        return Err(short("out", n * cols));
    }
    let f = dev.function(KernelModule::Dequant, &kernel_names::embed(dtype))?;
    let (n_arg, cols_arg) = (int(n, "tokens")?, int(cols, "cols")?);
    let mut launch = dev.stream().launch_builder(&f);
    launch
        .arg(&table)
        .arg(&slot)
        .arg(&tokens)
        .arg(out)
        .arg(&n_arg)
        .arg(&cols_arg);
    // SAFETY: `out` holds n·cols floats; tokens index rows of the matrix
    // (the caller checked them against its row count).
    unsafe { launch.launch(cfg((dim((n * cols).div_ceil(256), "elements")?, 1), 256)) }
        .map_err(driver("embed"))?;
    Ok(())
}

/// The whole `rows × cols` matrix at `slot` decoded to F16 bits in `out`.
pub fn dequant_f16(
    dev: &CudaDevice,
    table: u64,
    slot: u32,
    dtype: DType,
    out: &mut CudaSlice<u16>,
    rows: usize,
    cols: usize,
) -> Result<(), CudaError> {
    if out.len() < rows * cols {
        return Err(short("out", rows * cols));
    }
    let f = dev.function(KernelModule::Dequant, &kernel_names::dequant_f16(dtype))?;
    let (rows_arg, cols_arg) = (int(rows, "rows")?, int(cols, "cols")?);
    let mut launch = dev.stream().launch_builder(&f);
    launch
        .arg(&table)
        .arg(&slot)
        .arg(out)
        .arg(&rows_arg)
        .arg(&cols_arg);
    // SAFETY: `out` holds rows·cols halves; the slot holds the matrix.
    unsafe { launch.launch(cfg((dim((rows * cols).div_ceil(256), "elements")?, 1), 256)) }
        .map_err(driver("dequant_f16"))?;
    Ok(())
}
