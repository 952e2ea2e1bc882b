//! A model of the compiled policy: its versions, economics, limits, split and fallbacks.

use std::sync::Arc;

use serde::Serialize;

use crate::measured::Measurement;
use crate::spend::Price;

/// One model with its versions and economics.
#[derive(Debug)]
pub struct Model {
    /// Unique name.
    pub name: Arc<str>,
    /// Known versions, in file order.
    pub versions: Vec<Arc<str>>,
    /// Index into `versions` served when no split or pin applies.
    pub active_version: usize,
    /// Other names for this model.
    pub aliases: Vec<Arc<str>>,
    /// Cost per 1,000 prompt tokens.
    pub cost_per_1k_input: f64,
    /// Cost per 1,000 generated tokens.
    pub cost_per_1k_output: f64,
    /// Overall quality, 0..=1.
    pub quality: f64,
    /// Quality per task tag, 0..=1, sorted by tag; tags not listed use `quality`.
    /// A short vector: a linear scan beats hashing for the handful of tags a model has.
    pub quality_by_tag: Vec<(String, f64)>,
    /// Most tokens (prompt + output) the model accepts.
    pub context_limit: u32,
    /// Expected latency above which the model counts as overloaded.
    pub latency_target_ms: Option<f64>,
    /// Queue depth at or above which the model counts as overloaded.
    pub max_queue_depth: Option<u32>,
    /// Index of the split deciding this model's version, if any.
    pub split: Option<usize>,
    /// What to try when this model is overloaded, failing or over budget.
    pub fallback: Option<Fallback>,
    /// Where the quality figures are measured, when the file says `quality_from`.
    pub quality_from: Option<QualityFrom>,
}

/// A model's measured quality (`quality_from`, `quality_from_by_tag`): the suites, the
/// figures the file declares as fallback, and what the last resolution found.
#[derive(Debug, Clone, Default)]
pub struct QualityFrom {
    /// The suite of the overall quality.
    pub suite: Option<String>,
    /// Per tag, its suite; sorted by tag.
    pub by_tag: Vec<(String, String)>,
    /// `quality` as the file writes it: used while no fresh measurement exists.
    pub declared: Option<f64>,
    /// `quality_by_tag` as the file writes it.
    pub declared_by_tag: Vec<(String, f64)>,
    /// One entry per suite asked, filled when the policy is resolved against a
    /// [`crate::QualitySource`].
    pub origins: Vec<QualityOrigin>,
}

/// Where one quality figure of a model came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QualityOrigin {
    /// `None` for the overall quality.
    pub tag: Option<String>,
    /// The suite asked.
    pub suite: String,
    /// The version measured (the model's active version).
    pub version: Arc<str>,
    /// What the source had.
    pub measurement: Measurement,
    /// The figure routing uses.
    pub used: f64,
    /// Why that figure: `measured`, `declared` (no fresh measurement), `overall` (a tag
    /// without a fresh measurement or a declared figure) or `none` (counted as 0).
    pub basis: &'static str,
}

impl Model {
    /// Quality for a set of tags: the lowest per-tag score (overall for unlisted tags),
    /// or the overall score with no tags. Returns the tag that set it.
    pub fn quality_for<'t>(&self, tags: &'t [String]) -> (f64, Option<&'t str>) {
        let mut best: Option<(f64, &str)> = None;
        for tag in tags {
            let q = self
                .quality_by_tag
                .iter()
                .find(|(t, _)| t == tag)
                .map_or(self.quality, |&(_, q)| q);
            if best.is_none_or(|(b, _)| q < b) {
                best = Some((q, tag.as_str()));
            }
        }
        match best {
            Some((q, tag)) => (q, Some(tag)),
            None => (self.quality, None),
        }
    }

    /// The prices this model sets, for estimates and settling.
    pub(crate) fn price(&self) -> Price {
        Price {
            per_1k_input: self.cost_per_1k_input,
            per_1k_output: self.cost_per_1k_output,
        }
    }
}

/// One checkpoint of the policy, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    /// Index into [`crate::Policy::models`].
    pub model: usize,
    /// Index into that model's versions; `None` means "as if named": split or active.
    pub version: Option<usize>,
}

/// Conditions under which a fallback list is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Triggers {
    /// Latency target or queue limit broken.
    pub overloaded: bool,
    /// The engine reports the checkpoint unhealthy.
    pub failing: bool,
    /// A tenant budget cannot cover the request.
    pub over_budget: bool,
}

/// Ordered alternatives for one model.
#[derive(Debug, Clone)]
pub struct Fallback {
    /// When to use them.
    pub on: Triggers,
    /// Tried in order; the first that meets every constraint wins.
    pub alternatives: Vec<Target>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quality_for_tags_takes_the_weakest() {
        let m = Model {
            name: "m".into(),
            versions: vec!["1".into()],
            active_version: 0,
            aliases: vec![],
            cost_per_1k_input: 0.0,
            cost_per_1k_output: 0.0,
            quality: 0.5,
            quality_by_tag: vec![("code".to_string(), 0.9), ("math".to_string(), 0.3)],
            context_limit: 10,
            latency_target_ms: None,
            max_queue_depth: None,
            split: None,
            fallback: None,
            quality_from: None,
        };
        assert_eq!(m.quality_for(&[]), (0.5, None));
        assert_eq!(m.quality_for(&["code".into()]), (0.9, Some("code")));
        let tags = ["code".to_string(), "math".to_string(), "prose".to_string()];
        assert_eq!(m.quality_for(&tags), (0.3, Some("math")));
    }
}
