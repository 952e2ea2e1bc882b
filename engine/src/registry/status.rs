//! What the registry reports: per model, per version, and memory by tier.

use serde::Serialize;
use switchyard_kernels::WeightTier;

/// Where a version's weights are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// In RAM, ready to run (a CPU backend, whose device memory is RAM).
    Ram,
    /// In a GPU's memory, ready to run.
    Device,
    /// Loaded, its matrices in (pinned) host memory: evicted from the
    /// device into the backend's host tier, or copying up again (the
    /// executor prefetches it when requests for it wait, and runs it once
    /// the copy has landed).
    Host,
    /// Being read from its file.
    Loading,
    /// Only in its file.
    Disk,
}

impl Tier {
    /// Where a loaded checkpoint of backend `B` is: a device backend's
    /// weights are in device memory, the CPU's in RAM.
    pub fn resident<B: switchyard_kernels::Backend>() -> Tier {
        if B::DEVICE_MEMORY {
            Tier::Device
        } else {
            Tier::Ram
        }
    }

    /// Where a loaded checkpoint of backend `B` whose matrices the
    /// backend holds at `placement` is.
    pub fn loaded<B: switchyard_kernels::Backend>(placement: WeightTier) -> Tier {
        match placement {
            WeightTier::Resident => Tier::resident::<B>(),
            WeightTier::Uploading | WeightTier::Host => Tier::Host,
        }
    }

    /// Ready to run without a copy.
    pub fn is_resident(self) -> bool {
        matches!(self, Tier::Ram | Tier::Device)
    }
}

/// What routing reads about one checkpoint ([`super::Registry::routing_state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingState {
    /// Where its weights are.
    pub tier: Tier,
    /// Its size: in RAM when resident, else on disk (as registered).
    pub bytes: u64,
    /// Requests waiting for it (0 unless resident).
    pub queued: usize,
}

/// One version of a model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VersionStatus {
    pub version: String,
    pub path: String,
    pub tier: Tier,
    pub active: bool,
    /// Bytes of the file (on disk) or of its tensors (resident).
    pub bytes: u64,
    /// Of `bytes`, how many are tensors shared with other resident checkpoints.
    pub shared_bytes: u64,
    /// Requests waiting or running on it.
    pub in_flight: usize,
    pub queued: usize,
    /// Milliseconds the last load took.
    pub load_ms: Option<f64>,
    /// Why the last load failed, if it did.
    pub last_error: Option<String>,
    /// The model family (`llama`, `gemma3`, ...), once loaded.
    pub family: Option<String>,
    /// Its tensor types (`Q4_K_M: Q5_0 81, Q4_K 27, ...`), once loaded.
    pub quant_mix: Option<String>,
    /// For a LoRA adapter's version: the base model it serves over, the
    /// adapter's file or folder, and its bytes once resident.
    pub parent: Option<String>,
    pub adapter: Option<String>,
    pub adapter_bytes: Option<u64>,
    /// Evicted by the adapter budget; the next request for it loads it again.
    pub evicted: bool,
}

/// The resident LoRA adapters against their budget (`--lora-budget-mb`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AdapterUsage {
    pub budget_bytes: Option<u64>,
    /// Bytes the resident adapters hold (their A and B matrices).
    pub resident_bytes: u64,
    /// Adapters evicted by the budget since startup.
    pub evictions: u64,
    /// Every registered adapter version, resident or not.
    pub adapters: Vec<AdapterStatus>,
}

/// One adapter version as [`AdapterUsage`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AdapterStatus {
    pub name: String,
    pub version: String,
    pub parent: String,
    pub path: String,
    pub active: bool,
    pub resident: bool,
    pub bytes: u64,
    /// Requests running on it (holding a sequence slot).
    pub running: usize,
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Not resident, and being loaded (again) for requests, or queued to
    /// load when the adapter budget has room.
    pub loading: bool,
    /// Milliseconds since a request last used it.
    pub idle_ms: u64,
}

/// One model and its versions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelStatus {
    pub name: String,
    pub aliases: Vec<String>,
    pub active_version: Option<String>,
    /// Versions rollback would return to, most recent last.
    pub rollback_history: Vec<String>,
    pub versions: Vec<VersionStatus>,
}

/// Bytes by tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryStatus {
    /// Distinct tensor bytes in RAM (shared tensors counted once).
    pub ram_bytes: u64,
    /// What the resident versions would take without sharing.
    pub ram_bytes_without_sharing: u64,
    /// The RAM budget, if one is set.
    pub ram_budget_bytes: Option<u64>,
    /// Bytes of known versions that are only on disk.
    pub disk_bytes: u64,
    /// Bytes of matrices a device backend moved to host memory (its host
    /// tier); 0 on the CPU.
    pub host_bytes: u64,
    pub resident_versions: usize,
    /// Loaded versions whose matrices are in the host tier.
    pub host_versions: usize,
    pub disk_versions: usize,
}
