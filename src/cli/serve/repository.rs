//! Serving from a model repository (`REPO/<model>/<version>/`, adapters in
//! `REPO/<model>/adapters/<name>/<version>/`): which
//! versions to load at startup, and a rescan before each admin load so
//! that versions published later can be loaded without a restart.

use std::path::{Path, PathBuf};

use anyhow::Context;
use switchyard_engine::registry::Registry;
use switchyard_engine::repository::ModelRepository;
use switchyard_engine::serving::{AdapterSource, CheckpointOptions};
use switchyard_kernels::Backend;

/// A repository folder the server serves from.
#[derive(Clone, Debug)]
pub struct RepositoryWatch {
    root: PathBuf,
}

/// A version to load at startup, and whether it becomes the model's active one.
pub struct StartupVersion {
    pub model: String,
    pub version: String,
    pub activate: bool,
}

impl RepositoryWatch {
    /// The repository folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Scans `root`, registers every version it holds and returns the
    /// versions each model's policy serves (its default version active), and
    /// what the scan skipped (a model.toml typo, a corrupt file) as problems.
    pub fn open<B: Backend>(
        root: &Path,
        registry: &Registry<B>,
    ) -> anyhow::Result<(RepositoryWatch, Vec<StartupVersion>, Vec<String>)> {
        let repository = ModelRepository::open(root)
            .with_context(|| format!("cannot open the model repository {}", root.display()))?;
        let watch = RepositoryWatch {
            root: root.to_path_buf(),
        };
        watch.register(&repository, registry);
        let skipped: Vec<String> = repository
            .problems
            .iter()
            .map(|problem| format!("skipped in the model repository: {problem}"))
            .collect();
        let mut startup = Vec::new();
        for model in &repository.models {
            let default = model.default_version().map(|v| v.version.clone());
            for version in model.served_versions() {
                startup.push(StartupVersion {
                    model: model.name.clone(),
                    version: version.version.clone(),
                    activate: default.as_deref() == Some(version.version.as_str()),
                });
            }
        }
        // Each adapter's newest version is preloaded and active; the older
        // ones load through the admin API (`.../versions/V/load`).
        for model in &repository.models {
            for adapter in &model.adapters {
                if let Some(latest) = adapter.latest() {
                    startup.push(StartupVersion {
                        model: adapter.name.clone(),
                        version: latest.version.clone(),
                        activate: true,
                    });
                }
            }
        }
        if startup.is_empty() {
            let mut text = format!(
                "the model repository {} has no servable version; lay it out as \
                 REPO/<model>/<version>/<file>.gguf (see `switchyard models {}`)",
                root.display(),
                root.display()
            );
            for problem in &skipped {
                text.push_str("\n  - ");
                text.push_str(problem);
            }
            anyhow::bail!(text);
        }
        Ok((watch, startup, skipped))
    }

    /// Rescans the folder and registers versions added since (what was
    /// registered before stays). Returns why `model@version` is unusable
    /// when the scan skipped its folder (a corrupt file, say).
    pub fn refresh<B: Backend>(
        &self,
        registry: &Registry<B>,
        model: &str,
        version: &str,
    ) -> Option<String> {
        match ModelRepository::open(&self.root) {
            Ok(repository) => {
                for problem in &repository.problems {
                    tracing::warn!(%problem, "skipped in the model repository");
                }
                self.register(&repository, registry);
                let folder = self.root.join(model).join(version);
                repository
                    .problems
                    .iter()
                    .find(|p| p.path.starts_with(&folder))
                    .map(ToString::to_string)
            }
            Err(error) => {
                tracing::warn!(%error, "cannot rescan the model repository");
                None
            }
        }
    }

    fn register<B: Backend>(&self, repository: &ModelRepository, registry: &Registry<B>) {
        for model in &repository.models {
            for version in &model.versions {
                registry.register(&model.name, &version.version, &version.path, &model.aliases);
            }
            let options = CheckpointOptions {
                chat_template: model.chat_template.clone(),
                ctx_size: model.ctx_size,
                adapter: None,
                draft: None,
            };
            registry.configure(&model.name, options.clone());
            // Adapters serve over the model's default version, with its options.
            let Some(base) = model.default_version() else {
                continue;
            };
            for adapter in &model.adapters {
                for version in &adapter.versions {
                    let source = AdapterSource {
                        path: version.path.clone(),
                        parent: model.name.clone(),
                    };
                    registry.register_adapter(&adapter.name, &version.version, &base.path, source);
                }
                registry.configure(&adapter.name, options.clone());
            }
        }
    }
}
