//! A model repository, laid out like Triton's:
//!
//! ```text
//! REPO/
//!   smollm2/
//!     model.toml          optional: aliases, default_version, [version_policy]
//!     1/SmolLM2-135M-Instruct.Q4_1.gguf
//!     2/smollm2-q8_0.gguf
//!   qwen-small/
//!     3/{config.json, model.safetensors, tokenizer.json, ...}
//!   smollm2/adapters/pirate/1/{adapter_config.json, ...}   a LoRA adapter (`adapters.rs`)
//! ```
//!
//! A version folder holds one checkpoint: a `.gguf` file or a Hugging Face
//! folder. Version names are folder names; numeric ones sort numerically,
//! the others lexically after them. [`ModelRepository::open`] inspects every
//! version (headers only, nothing dequantized); a broken model, version or
//! `model.toml` becomes a [`RepositoryProblem`] and the rest still loads.
//!
//! `model.toml` (every key optional, unknown keys refused):
//!
//! ```toml
//! aliases = ["small", "chat"]
//! default_version = "2"      # default: the highest served version
//! [version_policy]           # default: latest = 1
//! latest = 2                 # or: all = true   or: versions = ["1", "3"]
//! ```
//!
//! ```no_run
//! use switchyard_engine::repository::ModelRepository;
//!
//! let repo = ModelRepository::open(std::path::Path::new("models"))?;
//! for problem in &repo.problems {
//!     eprintln!("skipped {problem}");
//! }
//! let (model, version) = repo.resolve("smollm2@2")?;
//! println!("{} v{} at {}", model.name, version.version, version.path.display());
//! # Ok::<(), switchyard_engine::repository::RepositoryError>(())
//! ```

mod adapters;
pub mod demo;
mod error;
mod inspect;
mod model_toml;
mod repo_model;
mod scan;

use std::path::{Path, PathBuf};

pub use adapters::{RepoAdapter, RepoAdapterVersion, ADAPTERS_DIR};
pub use error::{RepositoryError, RepositoryProblem};
pub use inspect::{compare_versions, RepoVersion};
pub use model_toml::{parse_model_toml, ModelToml, VersionPolicy};
pub use repo_model::RepoModel;

/// Every usable model of a repository folder, and what could not be used.
#[derive(Clone, Debug)]
pub struct ModelRepository {
    pub root: PathBuf,
    /// Sorted by name.
    pub models: Vec<RepoModel>,
    /// Models, versions and `model.toml` files that were skipped, and why.
    pub problems: Vec<RepositoryProblem>,
}

impl ModelRepository {
    /// Scans the repository at `root`. Fails only when `root` itself cannot
    /// be read; anything wrong inside is recorded in `problems`.
    pub fn open(root: &Path) -> Result<ModelRepository, RepositoryError> {
        let (models, problems) = scan::scan(root)?;
        Ok(ModelRepository {
            root: root.to_path_buf(),
            models,
            problems,
        })
    }

    /// The model with this name or alias.
    pub fn model(&self, name_or_alias: &str) -> Option<&RepoModel> {
        self.models
            .iter()
            .find(|m| m.name == name_or_alias)
            .or_else(|| {
                self.models
                    .iter()
                    .find(|m| m.aliases.iter().any(|a| a == name_or_alias))
            })
    }

    /// Resolves `name`, `alias` or `name@version` (either name may carry a
    /// version). Without a version it gives the model's default version; with
    /// one it gives that version if it is on disk, whether or not the policy
    /// serves it (check [`RepoModel::serves`] where that matters).
    pub fn resolve(&self, spec: &str) -> Result<(&RepoModel, &RepoVersion), RepositoryError> {
        let bad = |reason: &str| RepositoryError::BadSpec {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let (name, version) = match spec.split_once('@') {
            Some((name, version)) => (name, Some(version)),
            None => (spec, None),
        };
        if !scan::valid_name(name) {
            return Err(bad(
                "the model name must be non-empty letters, digits, '.', '_' or '-'",
            ));
        }
        if version.is_some_and(|v| !scan::valid_name(v)) {
            return Err(bad(
                "the version after '@' must be non-empty letters, digits, '.', '_' or '-'",
            ));
        }
        let model = self
            .model(name)
            .ok_or_else(|| RepositoryError::UnknownModel {
                name: name.to_string(),
                root: self.root.clone(),
                known: self.model_list(),
            })?;
        let found = match version {
            Some(v) => model
                .version(v)
                .ok_or_else(|| RepositoryError::UnknownVersion {
                    model: model.name.clone(),
                    version: v.to_string(),
                    available: model.version_list(),
                })?,
            None => model
                .default_version()
                .ok_or_else(|| RepositoryError::NothingServed {
                    model: model.name.clone(),
                    available: model.version_list(),
                })?,
        };
        Ok((model, found))
    }

    fn model_list(&self) -> String {
        if self.models.is_empty() {
            return "no models".into();
        }
        self.models
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
