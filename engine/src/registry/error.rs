//! Errors of the version lifecycle, each naming the model and version.

/// What kind of failure, for the admin API's status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistryErrorKind {
    /// No such model or version.
    NotFound,
    /// The operation conflicts with the state (unload the active version,
    /// activate one not loaded, a load already running).
    Conflict,
    /// The checkpoint is corrupt or does not match the model.
    Invalid,
    /// Not enough memory within the budget.
    Unavailable,
}

/// A lifecycle operation that failed; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RegistryError {
    pub kind: RegistryErrorKind,
    pub message: String,
}

impl RegistryError {
    pub(super) fn not_found(message: String) -> Self {
        RegistryError {
            kind: RegistryErrorKind::NotFound,
            message,
        }
    }

    pub(super) fn conflict(message: String) -> Self {
        RegistryError {
            kind: RegistryErrorKind::Conflict,
            message,
        }
    }

    pub(super) fn invalid(message: String) -> Self {
        RegistryError {
            kind: RegistryErrorKind::Invalid,
            message,
        }
    }

    pub(super) fn unavailable(message: String) -> Self {
        RegistryError {
            kind: RegistryErrorKind::Unavailable,
            message,
        }
    }
}
