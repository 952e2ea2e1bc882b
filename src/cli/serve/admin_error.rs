//! The registry's errors as the admin API answers them.

use switchyard_engine::registry::{RegistryError, RegistryErrorKind};
use switchyard_router::admin::{AdminError, AdminErrorKind};

/// The same message, under the admin API's class (its HTTP status).
pub(super) fn admin_error(error: RegistryError) -> AdminError {
    let kind = match error.kind {
        RegistryErrorKind::NotFound => AdminErrorKind::NotFound,
        RegistryErrorKind::Conflict => AdminErrorKind::Conflict,
        RegistryErrorKind::Invalid => AdminErrorKind::Invalid,
        RegistryErrorKind::Unavailable => AdminErrorKind::Unavailable,
    };
    AdminError {
        kind,
        message: error.message,
    }
}
