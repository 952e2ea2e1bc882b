//! Measured quality: what an evaluation found for one checkpoint on one suite, as a
//! policy reads it (`quality_from = "<suite>"`).
//!
//! The policy crate does not know where measurements are kept: the server hands it a
//! [`QualitySource`] (the model repository's stored `switchyard eval --save` records) and
//! the policy asks it, at load and at every reload, for the active version of each model
//! that takes its quality from a suite.

use std::fmt;

use serde::Serialize;

/// One stored evaluation result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measured {
    /// Accuracy, 0..=1.
    pub acc: f64,
    /// Items scored.
    pub n: u64,
    /// 95% interval of `acc`.
    pub ci95: [f64; 2],
}

/// What a source knows of one checkpoint on one suite.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Measurement {
    /// A measurement that still describes the checkpoint on the suite.
    Fresh { measured: Measured },
    /// A measurement the suite or the checkpoint changed under since; not used.
    Stale { measured: Measured, why: String },
    /// Nothing to use, and why (never measured, no repository, ...).
    Missing { why: String },
}

impl Measurement {
    /// The figure a policy may route on: only a fresh one.
    pub fn fresh(&self) -> Option<Measured> {
        match self {
            Measurement::Fresh { measured } => Some(*measured),
            _ => None,
        }
    }
}

impl fmt::Display for Measured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "acc {:.3} [{:.3}, {:.3}], n {}",
            self.acc, self.ci95[0], self.ci95[1], self.n
        )
    }
}

impl fmt::Display for Measurement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Measurement::Fresh { measured } => write!(f, "{measured}, fresh"),
            Measurement::Stale { measured, why } => write!(f, "{measured}, {why}"),
            Measurement::Missing { why } => f.write_str(why),
        }
    }
}

/// Where measured quality comes from.
pub trait QualitySource: Send + Sync + fmt::Debug {
    /// What is known of `model@version` on suite `suite` (a suite's name: its file stem).
    fn measurement(&self, model: &str, version: &str, suite: &str) -> Measurement;

    /// Changes whenever a stored measurement may have changed (a new `eval --save`, a
    /// quality gate's run), so the policy watcher knows to resolve again.
    fn fingerprint(&self) -> u64;
}

/// The source of a policy loaded without one: every measurement is missing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMeasurements;

impl QualitySource for NoMeasurements {
    fn measurement(&self, _model: &str, _version: &str, _suite: &str) -> Measurement {
        Measurement::Missing {
            why: "no model repository to read measurements from (serve --repo, or --repo for \
                  policy explain)"
                .to_string(),
        }
    }

    fn fingerprint(&self) -> u64 {
        0
    }
}
