//! AMX on x86-64: whether this process may use the tile registers, and the
//! one tile configuration every AMX kernel here runs under (eight tiles of
//! 16 rows × 64 bytes, palette 1), loaded once per thread. The BF16
//! attention products (`attention::blocked_amx`) and the int8 prompt
//! matmuls (`packed::amx`) share it, so neither has to reload it after the
//! other ran on the same thread.
//!
//! Linux hands out the tile registers' 8 KB state only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, once per
//! process); where it refuses, or the CPU lacks the unit, or
//! `SWITCHYARD_AMX=0`, the kernels without AMX run.

use std::arch::asm;
use std::cell::Cell;
use std::sync::OnceLock;

/// Environment variable: `0` keeps every product off AMX on an AMX host
/// (to compare speed, or to keep the BF16 attention's one rounding order
/// everywhere).
pub(crate) const AMX_ENV_VAR: &str = "SWITCHYARD_AMX";

/// Whether the AMX-BF16 kernels may run in this process. Decided once.
pub(crate) fn bf16_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_has(AMX_BF16) && permitted())
}

/// Whether the AMX-INT8 kernels may run in this process. Decided once.
pub(crate) fn int8_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_has(AMX_INT8) && permitted())
}

/// CPUID leaf 7 EDX bits.
const AMX_BF16: u32 = 1 << 22;
const AMX_TILE: u32 = 1 << 24;
const AMX_INT8: u32 = 1 << 25;

fn cpu_has(unit: u32) -> bool {
    if std::arch::x86_64::__cpuid(0).eax < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    let want = unit | AMX_TILE;
    edx & want == want
}

/// `SWITCHYARD_AMX` is not `0` and Linux granted the tile data. Decided
/// once.
fn permitted() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let off = std::env::var(AMX_ENV_VAR).is_ok_and(|v| v.trim() == "0");
        !off && granted()
    })
}

/// Asks Linux for the tile data state (`ARCH_REQ_XCOMP_PERM` = 0x1023,
/// `XFEATURE_XTILEDATA` = 18); true once granted.
fn granted() -> bool {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a request about this process's own state; it changes
        // nothing else and reports failure through its return value.
        let r = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        r == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// `ldtilecfg`'s 64 bytes: palette 1, the eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

static CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

thread_local! {
    /// Whether this thread loaded [`CONFIG`]: the configuration is per
    /// thread and stays until `tilerelease`, which nothing here runs.
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// Loads the tile configuration on this thread, the first time.
///
/// # Safety
/// [`bf16_available`] or [`int8_available`] returned true.
pub(crate) unsafe fn configure() {
    if !CONFIGURED.get() {
        // SAFETY: a valid palette-1 configuration of 64 bytes; the caller
        // has the tile state (see `permitted`).
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly, preserves_flags))
        };
        CONFIGURED.set(true);
    }
}
