//! One model folder of a repository: its versions, aliases and version policy, and
//! which versions that policy serves.

use super::adapters::RepoAdapter;
use super::inspect::RepoVersion;
use super::model_toml::VersionPolicy;
use crate::chat_choice::TemplateSpec;

/// One model folder: its versions and settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoModel {
    /// The folder name.
    pub name: String,
    /// Other names for the model, unique across the repository.
    pub aliases: Vec<String>,
    /// The `default_version` of `model.toml`, when it names a served version.
    pub default_version: Option<String>,
    pub policy: VersionPolicy,
    /// `model.toml`'s chat template, a file's path resolved from the model's folder.
    pub chat_template: Option<TemplateSpec>,
    /// `model.toml`'s context window.
    pub ctx_size: Option<usize>,
    /// Every usable version on disk, oldest first (see
    /// [`compare_versions`](super::compare_versions)); never empty.
    pub versions: Vec<RepoVersion>,
    /// Its LoRA adapters (`adapters/<name>/<version>/`), by name.
    pub adapters: Vec<RepoAdapter>,
}

impl RepoModel {
    /// The versions the policy serves, oldest first.
    pub fn served_versions(&self) -> Vec<&RepoVersion> {
        match &self.policy {
            VersionPolicy::All => self.versions.iter().collect(),
            VersionPolicy::Latest(n) => {
                let skip = self.versions.len().saturating_sub(*n);
                self.versions.iter().skip(skip).collect()
            }
            VersionPolicy::Specific(listed) => self
                .versions
                .iter()
                .filter(|v| listed.contains(&v.version))
                .collect(),
        }
    }

    /// Whether the policy serves `version`.
    pub fn serves(&self, version: &str) -> bool {
        self.served_versions().iter().any(|v| v.version == version)
    }

    /// The version requests without `@version` get: `default_version` from
    /// `model.toml`, else the highest served version; `None` when the policy
    /// serves nothing on disk.
    pub fn default_version(&self) -> Option<&RepoVersion> {
        match &self.default_version {
            Some(v) => self.version(v),
            None => self.served_versions().last().copied(),
        }
    }

    /// The version named `version`, served or not.
    pub fn version(&self, version: &str) -> Option<&RepoVersion> {
        self.versions.iter().find(|v| v.version == version)
    }

    pub(super) fn version_list(&self) -> String {
        self.versions
            .iter()
            .map(|v| v.version.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
