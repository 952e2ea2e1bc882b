//! The compiled policy: what the file says, validated and indexed for routing. It never
//! changes once built; what requests change (spend, rollback state, probes, counters)
//! lives in [`crate::live`].

pub(crate) mod cascade;
pub(crate) mod measured;
pub(crate) mod model;
pub(crate) mod rate_limit;
pub(crate) mod scan_table;
pub(crate) mod split;
pub(crate) mod tags;
pub(crate) mod tenant;

use std::collections::HashMap;

use serde::Serialize;

use crate::keys::{self, KeyDigest};
use model::Model;
use scan_table::ScanTable;
use split::Split;
use tags::TagTable;
use tenant::Tenant;

/// Weights of the utility function and request defaults (`[routing]`).
///
/// `utility = quality_weight × quality − cost_weight × estimated_cost
///            − latency_weight × expected_latency_ms`
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Routing {
    /// Utility per quality point (quality is 0..=1).
    pub quality_weight: f64,
    /// Utility lost per unit of currency the request is estimated to cost.
    pub cost_weight: f64,
    /// Utility lost per millisecond of expected latency.
    pub latency_weight: f64,
    /// Output tokens assumed when a request sets no `max_tokens`.
    pub assumed_output_tokens: u32,
    /// Whether requests without an API key are routed (with no tenant).
    pub allow_anonymous: bool,
}

impl Default for Routing {
    fn default() -> Self {
        Routing {
            quality_weight: 1.0,
            cost_weight: 100.0,
            latency_weight: 0.0002,
            assumed_output_tokens: 256,
            allow_anonymous: false,
        }
    }
}

/// Models, tenants, splits and fallbacks as the file sets them, with the indices routing
/// reads: names to models, keys to tenants, checkpoint slots, tag and scan tables.
#[derive(Debug)]
pub(crate) struct CompiledPolicy {
    pub source_name: String,
    pub routing: Routing,
    pub models: Vec<Model>,
    /// Names and aliases to model indices.
    pub model_names: HashMap<Box<str>, usize>,
    pub tenants: Vec<Tenant>,
    pub tenant_names: HashMap<Box<str>, usize>,
    /// API key digests to tenant indices.
    pub keys: HashMap<KeyDigest, usize>,
    pub splits: Vec<Split>,
    /// Per model, the index of its first version among all checkpoints (for bitsets and
    /// per-checkpoint state).
    pub checkpoint_base: Vec<usize>,
    /// Number of checkpoints (model versions) in the policy.
    pub checkpoint_count: usize,
    /// Per-tag quality of every model, by tag id, for scoring.
    pub tags: TagTable,
    /// The numbers the `auto` scan checks for every model, as columns.
    pub scan: ScanTable,
    /// Whether some split arm targets another model than its split's: then two models
    /// can stand for the same checkpoint, and `auto` must drop the repeat.
    pub cross_model_arms: bool,
    /// `[cascade]`, if any.
    pub cascade: Option<cascade::Cascade>,
}

impl CompiledPolicy {
    /// The slot of checkpoint `model`/`version` (indices) among all checkpoints.
    #[inline]
    pub fn checkpoint_slot(&self, model: usize, version: usize) -> Option<usize> {
        Some(self.checkpoint_base.get(model)? + version)
    }

    /// The index of the tenant named `name`.
    pub fn tenant_index(&self, name: &str) -> Option<usize> {
        self.tenant_names.get(name).copied()
    }

    /// The index of the tenant owning API key `key` (hash lookup, constant-time confirm).
    pub fn key_owner(&self, key: &str) -> Option<usize> {
        let d = keys::digest(key);
        let (stored, &index) = self.keys.get_key_value(&d)?;
        keys::digests_equal(stored, &d).then_some(index)
    }

    /// The index of the split named `name`.
    pub fn split_index(&self, name: &str) -> Option<usize> {
        self.splits.iter().position(|s| &*s.name == name)
    }
}
