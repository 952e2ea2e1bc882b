//! LoRA adapters kept beside their base in the repository:
//!
//! ```text
//! REPO/smollm2/
//!   1/SmolLM2-135M-Instruct.Q4_1.gguf
//!   adapters/
//!     pirate/1/{adapter_config.json, adapter_model.safetensors}   (PEFT)
//!     pirate/2/pirate.gguf                                        (llama.cpp)
//! ```
//!
//! An adapter is served under its folder name (`pirate`, `pirate@2`) over
//! the model's default version, with the model's chat template and context
//! window; its versions follow the checkpoints' lifecycle (load, activate,
//! rollback, unload through `/admin/models`). The scan only finds the files:
//! an adapter is checked against the base (shapes, targets, values) when it
//! loads.

use std::path::{Path, PathBuf};

/// The folder inside a model's folder that holds its adapters.
pub const ADAPTERS_DIR: &str = "adapters";

/// One adapter of a repository model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoAdapter {
    /// The folder name: the name requests give.
    pub name: String,
    /// Every version found, oldest first (never empty).
    pub versions: Vec<RepoAdapterVersion>,
}

/// One version of an adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoAdapterVersion {
    pub version: String,
    /// The PEFT folder or the GGUF adapter file.
    pub path: PathBuf,
}

impl RepoAdapter {
    /// The version loaded and activated at startup: the newest.
    pub fn latest(&self) -> Option<&RepoAdapterVersion> {
        self.versions.last()
    }
}

/// The adapter inside a version folder: the folder itself when it holds
/// `adapter_config.json` (PEFT), else its one `.gguf` file.
pub(super) fn adapter_path(dir: &Path) -> Result<PathBuf, String> {
    if dir.join(crate::adapter::peft::CONFIG_FILE).is_file() {
        return Ok(dir.to_path_buf());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))?;
    let ggufs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    match ggufs.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(
            "holds neither adapter_config.json (a PEFT adapter) nor a .gguf adapter file"
                .to_string(),
        ),
        _ => Err(format!(
            "holds {} .gguf files; keep one adapter per version folder",
            ggufs.len()
        )),
    }
}
