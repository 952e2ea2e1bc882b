//! Serving from a model repository (`REPO/<model>/<version>/`): which
//! versions to load at startup, and a rescan before each admin load so
//! that versions published later can be loaded without a restart.

use std::path::{Path, PathBuf};

use anyhow::Context;
use switchyard_engine::registry::Registry;
use switchyard_engine::repository::ModelRepository;
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
    /// Scans `root`, registers every version it holds and returns the
    /// versions each model's policy serves (its default version active).
    pub fn open<B: Backend>(
        root: &Path,
        registry: &Registry<B>,
    ) -> anyhow::Result<(RepositoryWatch, Vec<StartupVersion>)> {
        let repository = ModelRepository::open(root)
            .with_context(|| format!("cannot open the model repository {}", root.display()))?;
        let watch = RepositoryWatch {
            root: root.to_path_buf(),
        };
        watch.register(&repository, registry);
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
        if startup.is_empty() {
            anyhow::bail!(
                "the model repository {} has no servable version; lay it out as \
                 REPO/<model>/<version>/<file>.gguf (see `switchyard models {}`)",
                root.display(),
                root.display()
            );
        }
        Ok((watch, startup))
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
        for problem in &repository.problems {
            tracing::warn!(%problem, "skipped in the model repository");
            eprintln!("switchyard: skipped in the model repository: {problem}");
        }
        for model in &repository.models {
            for version in &model.versions {
                registry.register(&model.name, &version.version, &version.path, &model.aliases);
            }
        }
    }
}
