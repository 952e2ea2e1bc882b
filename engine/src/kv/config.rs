//! The KV settings of a device: the element type, the block size and the
//! byte budget (`--kv-type`, `--kv-block`, `--kv-budget-mb`).

use switchyard_kernels::kv::DEFAULT_BLOCK_POSITIONS;
use switchyard_kernels::KvType;

/// The KV settings of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvConfig {
    pub dtype: KvType,
    /// Bytes all caches and cached prompt blocks may reserve together.
    pub budget_bytes: usize,
    /// Positions per block: the unit of allocation and of the prompt
    /// cache. A multiple of `switchyard_kernels::kv::KV_UNIT` (see
    /// `switchyard_kernels::kv::check_block_positions`).
    pub block_positions: usize,
}

impl Default for KvConfig {
    /// F16, half the memory available now (see [`default_budget`]), and
    /// blocks of `DEFAULT_BLOCK_POSITIONS`.
    fn default() -> Self {
        KvConfig {
            dtype: KvType::F16,
            budget_bytes: default_budget(),
            block_positions: DEFAULT_BLOCK_POSITIONS,
        }
    }
}

/// Half of the memory the kernel reports available (`MemAvailable`), the
/// rest left to weights, activations and the OS; 4 GiB where that cannot
/// be read.
pub fn default_budget() -> usize {
    const FALLBACK: usize = 4 << 30;
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        })
        .map(|kib| kib.saturating_mul(1024));
    available.map_or(FALLBACK, |bytes| bytes / 2)
}
