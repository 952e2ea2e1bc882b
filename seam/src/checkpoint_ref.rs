//! Which checkpoint a request runs on, typed: the one home of `name@version`.
//!
//! A request names a model as the client wrote it (a name, an alias, or
//! `name@version`); routing and the engine turn that into one checkpoint. Both
//! forms travel as types, so nothing formats `name@version` to split it again:
//! [`ModelSpec::parse`] is the only parser and the `Display` impls the only
//! writers.
//!
//! ```
//! use switchyard_seam::{CheckpointRef, ModelSpec};
//!
//! let pinned = ModelSpec::parse("smollm2@2");
//! assert_eq!(pinned, ModelSpec::Checkpoint(CheckpointRef::new("smollm2", "2")));
//! assert_eq!(pinned.to_string(), "smollm2@2");
//! assert_eq!(ModelSpec::parse("chat").name(), "chat");
//! ```

use std::fmt;

/// One checkpoint: a model name and one of its versions.
///
/// A LoRA adapter served on a checkpoint (`NAME@version` of an adapter) is to
/// ride on this type as a further field, so that every place that names a
/// checkpoint names the adapter with it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckpointRef {
    /// The model's name (never an alias).
    pub model: String,
    /// One of its versions.
    pub version: String,
}

impl CheckpointRef {
    /// Version `version` of `model`.
    pub fn new(model: impl Into<String>, version: impl Into<String>) -> Self {
        CheckpointRef {
            model: model.into(),
            version: version.into(),
        }
    }
}

impl fmt::Display for CheckpointRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.model, self.version)
    }
}

/// What a request asks to run on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ModelSpec {
    /// A model name or an alias: whichever version is active when it is resolved.
    Active(String),
    /// One version of one model.
    Checkpoint(CheckpointRef),
}

impl ModelSpec {
    /// `spec` as a client writes it: `name@version` names a checkpoint (split at
    /// the last `@`), anything else a model or an alias.
    pub fn parse(spec: &str) -> Self {
        match spec.rsplit_once('@') {
            Some((model, version)) => ModelSpec::Checkpoint(CheckpointRef::new(model, version)),
            None => ModelSpec::Active(spec.to_owned()),
        }
    }

    /// The model name or alias, without a version.
    pub fn name(&self) -> &str {
        match self {
            ModelSpec::Active(name) => name,
            ModelSpec::Checkpoint(checkpoint) => &checkpoint.model,
        }
    }

    /// The version asked for; `None`: the active one.
    pub fn version(&self) -> Option<&str> {
        match self {
            ModelSpec::Active(_) => None,
            ModelSpec::Checkpoint(checkpoint) => Some(&checkpoint.version),
        }
    }
}

impl From<CheckpointRef> for ModelSpec {
    fn from(checkpoint: CheckpointRef) -> Self {
        ModelSpec::Checkpoint(checkpoint)
    }
}

impl From<&str> for ModelSpec {
    fn from(spec: &str) -> Self {
        ModelSpec::parse(spec)
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelSpec::Active(name) => f.write_str(name),
            ModelSpec::Checkpoint(checkpoint) => checkpoint.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_through_their_text() {
        for text in ["m", "m@1", "org/m@v2.1", "a@b@c", "m@"] {
            assert_eq!(ModelSpec::parse(text).to_string(), text);
        }
        assert_eq!(ModelSpec::parse("a@b@c").name(), "a@b");
        assert_eq!(ModelSpec::parse("m").version(), None);
        assert_eq!(ModelSpec::parse("m@").version(), Some(""));
    }
}
