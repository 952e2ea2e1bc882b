//! What the admin API's handlers share: the token's digest, the policy store, the model
//! adapter and the activity log.

use std::sync::Arc;

use switchyard_policies::{key_digest, KeyDigest, PolicyStore};

use crate::admin::activity_log::ActivityLog;
use crate::admin::error::AdminApiError;
use crate::admin::model_admin::ModelAdmin;

/// What the admin API serves. Cheap to clone.
#[derive(Clone)]
pub struct AdminState {
    inner: Arc<Inner>,
}

struct Inner {
    token: KeyDigest,
    policy: Option<Arc<PolicyStore>>,
    models: Option<Arc<dyn ModelAdmin>>,
    activity: Arc<ActivityLog>,
}

impl AdminState {
    /// State for an admin API protected by `token`, managing `policy` and `models`
    /// (either may be absent: its endpoints then answer 404).
    pub fn new(
        token: String,
        policy: Option<Arc<PolicyStore>>,
        models: Option<Arc<dyn ModelAdmin>>,
    ) -> Self {
        AdminState {
            inner: Arc::new(Inner {
                // Only the digest is kept: comparing digests in constant time leaks
                // nothing about the token, and the token itself is not held in memory.
                token: key_digest(&token),
                policy,
                models,
                activity: Arc::default(),
            }),
        }
    }

    pub(crate) fn token(&self) -> &KeyDigest {
        &self.inner.token
    }

    pub(crate) fn activity(&self) -> &Arc<ActivityLog> {
        &self.inner.activity
    }

    pub(crate) fn policy(&self) -> Result<&Arc<PolicyStore>, AdminApiError> {
        self.inner
            .policy
            .as_ref()
            .ok_or(AdminApiError::NotConfigured {
                what: "routing policy",
                how: "start `switchyard serve` with --policy FILE",
            })
    }

    pub(crate) fn models(&self) -> Result<Arc<dyn ModelAdmin>, AdminApiError> {
        self.inner
            .models
            .clone()
            .ok_or(AdminApiError::NotConfigured {
                what: "model lifecycle",
                how: "serve with an engine that supports model administration",
            })
    }
}
