//! What can go wrong opening a model repository or resolving a model in it.

use std::path::PathBuf;

/// An error that stops a repository call. Problems with single models or
/// versions do not stop [`super::ModelRepository::open`]; they are recorded
/// as [`RepositoryProblem`]s instead.
#[derive(Debug, thiserror::Error)]
pub enum RepositoryError {
    #[error(
        "cannot read the model repository {path}: {source}; check that the folder exists and \
         is readable"
    )]
    RootUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("'{spec}' is not a model specification: {reason}; write NAME, ALIAS or NAME@VERSION")]
    BadSpec { spec: String, reason: String },
    #[error("no model or alias '{name}' in the repository {root}; it holds: {known}")]
    UnknownModel {
        name: String,
        root: PathBuf,
        known: String,
    },
    #[error("model '{model}' has no version '{version}' on disk; its versions are: {available}")]
    UnknownVersion {
        model: String,
        version: String,
        available: String,
    },
    #[error(
        "model '{model}' has no version to serve: its version policy selects none of the \
         versions on disk ({available}); fix version_policy in its model.toml"
    )]
    NothingServed { model: String, available: String },
}

/// A model, a version or a `model.toml` that could not be used. The rest
/// of the repository loads without it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepositoryProblem {
    /// The folder or file at fault.
    pub path: PathBuf,
    /// What is wrong and what to do about it.
    pub reason: String,
}

impl RepositoryProblem {
    pub(crate) fn new(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for RepositoryProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}
