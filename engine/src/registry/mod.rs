//! Model versions: which checkpoint versions are known, resident and
//! active, and the lifecycle that moves them: load (beside the active one,
//! validated, smoke-tested), activate (atomic), rollback, unload.
//!
//! Requests resolve a model name to its active version's handle once, at
//! submit; the handle pins that version until the request ends, so an
//! activation, rollback or unload never moves a request in flight.
//!
//! - `error.rs`: what can go wrong, for the admin API;
//! - `status.rs`: the serializable views (models, versions, memory);
//! - `registration.rs`: an adapter registered at run time, as asked;
//! - `live.rs`: each version's routing state, readable without the lock;
//! - `residency.rs`: the RAM budget and which version to evict;
//! - `versions.rs`: the registry itself; `versions/adapters.rs`: LoRA
//!   adapters registered at run time and their byte budget (LRU);
//!   `versions/reload.rs`: an evicted adapter loaded again in the
//!   background for the requests that ask for it.

mod error;
mod live;
mod registration;
mod residency;
mod status;
mod versions;

pub use error::{RegistryError, RegistryErrorKind};
pub use live::LiveSlot;
pub use registration::AdapterRegistration;
pub use residency::{eviction_order, EvictionCandidate};
pub use status::{
    AdapterStatus, AdapterUsage, MemoryStatus, ModelStatus, RoutingState, Tier, VersionStatus,
};
pub use versions::{LoadReport, Registry, RegistryObserver};
