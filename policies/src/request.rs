//! What a request brings to routing: the `model` hint, the caller and the routing hints.
//!
//! Header names are plain strings here so the router and `switchyard policy explain` read
//! hints the same way; this crate still knows nothing of HTTP.

use serde::{Deserialize, Serialize};

/// Request header: lowest acceptable quality (0..=1).
pub const HEADER_MIN_QUALITY: &str = "x-switchyard-min-quality";
/// Request header: highest acceptable estimated cost of this request, in policy currency.
pub const HEADER_MAX_COST: &str = "x-switchyard-max-cost";
/// Request header: highest acceptable expected latency in milliseconds.
pub const HEADER_MAX_LATENCY_MS: &str = "x-switchyard-max-latency-ms";
/// Request header: comma-separated task tags (`code,math`) selecting per-tag quality.
pub const HEADER_TAGS: &str = "x-switchyard-tags";
/// Response header: the model that answered.
pub const HEADER_MODEL: &str = "x-switchyard-model";
/// Response header: its version.
pub const HEADER_VERSION: &str = "x-switchyard-version";
/// Response header: why this checkpoint was chosen.
pub const HEADER_ROUTE: &str = "x-switchyard-route";
/// Response header: the estimated cost of the request.
pub const HEADER_COST: &str = "x-switchyard-cost";
/// Response header: what the policy's cascade made of the answer (accepted, or deferred
/// from which checkpoint, and why).
pub const HEADER_CASCADE: &str = "x-switchyard-cascade";
/// Response header: a cascade's handoff, which checkpoints wrote the answer and how many
/// tokens of the first one's were kept (`from=small@1 kept=9 to=big@1`; `kept=9,4` for
/// several choices).
pub const HEADER_HANDOFF: &str = "x-switchyard-handoff";
/// Response header (whole-JSON answers): the engine's confidence in the answer, every
/// statistic a cascade may compare (`tokens=3 mean=-0.2 ... margin=2.5 entropy=0.9`,
/// the least sure choice's), so a client calibrates on the numbers the server compares.
pub const HEADER_CONFIDENCE: &str = "x-switchyard-confidence";

/// The `model` field of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelHint {
    /// `auto` (or empty): let the policy choose among every permitted model.
    Auto,
    /// A model name or an alias; the version comes from a split or the active version.
    Named {
        /// The name or alias as given.
        name: String,
    },
    /// `name@version`: exactly this checkpoint (splits do not apply).
    Pinned {
        /// Model name or alias.
        name: String,
        /// Version.
        version: String,
    },
}

impl ModelHint {
    /// Parses the OpenAI `model` field: `auto`, `name`, `alias` or `name@version`.
    pub fn parse(model: &str) -> ModelHint {
        let model = model.trim();
        if model.is_empty() || model.eq_ignore_ascii_case("auto") {
            return ModelHint::Auto;
        }
        match model.split_once('@') {
            Some((name, version)) => ModelHint::Pinned {
                name: name.to_string(),
                version: version.to_string(),
            },
            None => ModelHint::Named {
                name: model.to_string(),
            },
        }
    }
}

impl std::fmt::Display for ModelHint {
    /// The hint as a client would write it: `auto`, `name` or `name@version`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelHint::Auto => write!(f, "auto"),
            ModelHint::Named { name } => write!(f, "{name}"),
            ModelHint::Pinned { name, version } => write!(f, "{name}@{version}"),
        }
    }
}

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No credentials; allowed only when the policy sets `routing.allow_anonymous`.
    Anonymous,
    /// The bearer API key as sent; it is hashed and looked up in the policy.
    ApiKey(String),
    /// A tenant already authenticated by the caller (by name).
    Tenant(String),
}

/// Constraints a request (or a tenant's defaults) puts on the choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hints {
    /// Lowest acceptable quality (for each tag when tags are given).
    pub min_quality: Option<f64>,
    /// Highest acceptable estimated cost of the request.
    pub max_cost: Option<f64>,
    /// Highest acceptable expected latency in milliseconds.
    pub max_latency_ms: Option<f64>,
    /// Task tags selecting per-tag quality scores.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// A hint header whose value could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HintError {
    /// Not a number.
    #[error("header {header}: `{value}` is not a number; send a plain decimal such as `{header}: {example}`")]
    NotANumber {
        /// Header name.
        header: &'static str,
        /// Value as sent.
        value: String,
        /// A valid example value.
        example: &'static str,
    },
    /// A number outside the accepted range.
    #[error("header {header}: {value} is out of range; it must lie in {range}")]
    OutOfRange {
        /// Header name.
        header: &'static str,
        /// Value as sent.
        value: f64,
        /// The accepted range, in words.
        range: &'static str,
    },
}

impl Hints {
    /// Applies one header if it is an `x-switchyard-*` hint (name compared without case).
    /// Returns `Ok(false)` for any other header, so callers can feed it every header.
    pub fn apply_header(&mut self, name: &str, value: &str) -> Result<bool, HintError> {
        let name = name.trim();
        if name.eq_ignore_ascii_case(HEADER_MIN_QUALITY) {
            let v = number(HEADER_MIN_QUALITY, value, "0.7")?;
            if !(0.0..=1.0).contains(&v) {
                return Err(out_of_range(HEADER_MIN_QUALITY, v, "0 to 1"));
            }
            self.min_quality = Some(v);
        } else if name.eq_ignore_ascii_case(HEADER_MAX_COST) {
            let v = number(HEADER_MAX_COST, value, "0.01")?;
            if v < 0.0 {
                return Err(out_of_range(HEADER_MAX_COST, v, "0 or more"));
            }
            self.max_cost = Some(v);
        } else if name.eq_ignore_ascii_case(HEADER_MAX_LATENCY_MS) {
            let v = number(HEADER_MAX_LATENCY_MS, value, "2000")?;
            if v <= 0.0 {
                return Err(out_of_range(HEADER_MAX_LATENCY_MS, v, "more than 0"));
            }
            self.max_latency_ms = Some(v);
        } else if name.eq_ignore_ascii_case(HEADER_TAGS) {
            self.tags = value
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect();
        } else {
            return Ok(false);
        }
        Ok(true)
    }
}

fn number(header: &'static str, value: &str, example: &'static str) -> Result<f64, HintError> {
    match value.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(HintError::NotANumber {
            header,
            value: value.to_string(),
            example,
        }),
    }
}

fn out_of_range(header: &'static str, value: f64, range: &'static str) -> HintError {
    HintError::OutOfRange {
        header,
        value,
        range,
    }
}

/// Everything routing needs from one request.
#[derive(Debug, Clone)]
pub struct RouteRequest {
    /// The `model` field.
    pub model: ModelHint,
    /// Credentials or an authenticated tenant.
    pub caller: Caller,
    /// The OpenAI `user` field; keeps a user on one split arm.
    pub user: Option<String>,
    /// Hints from `x-switchyard-*` headers; tenant defaults fill the gaps.
    pub hints: Hints,
    /// Estimated prompt tokens (see [`estimate_tokens`]).
    pub prompt_tokens: u32,
    /// `max_tokens` of the request, if given.
    pub max_output_tokens: Option<u32>,
    /// Generations the request fans out into (prompts × `n`), at least 1: the budget
    /// reservation covers every one of them.
    pub generations: u32,
    /// A per-request number; splits that are not sticky hash it to pick an arm.
    pub request_id: u64,
}

impl RouteRequest {
    /// A request for `model` by `caller` with no hints, no prompt and no output limit.
    pub fn new(model: ModelHint, caller: Caller) -> Self {
        RouteRequest {
            model,
            caller,
            user: None,
            hints: Hints::default(),
            prompt_tokens: 0,
            max_output_tokens: None,
            generations: 1,
            request_id: 0,
        }
    }
}

/// A cheap prompt-size estimate before tokenizing: about four characters per token,
/// rounded up. Routing only needs the order of magnitude; settling uses real counts.
pub fn estimate_tokens(chars: usize) -> u32 {
    u32::try_from(chars.div_ceil(4)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_model_hints() {
        assert_eq!(ModelHint::parse("auto"), ModelHint::Auto);
        assert_eq!(ModelHint::parse(""), ModelHint::Auto);
        assert_eq!(
            ModelHint::parse("smol@v2"),
            ModelHint::Pinned {
                name: "smol".into(),
                version: "v2".into()
            }
        );
        assert_eq!(
            ModelHint::parse("cheap"),
            ModelHint::Named {
                name: "cheap".into()
            }
        );
    }

    #[test]
    fn applies_hint_headers_and_ignores_others() {
        let mut h = Hints::default();
        assert!(h.apply_header("X-Switchyard-Min-Quality", "0.5").unwrap());
        assert!(h.apply_header("x-switchyard-tags", "code, math,").unwrap());
        assert!(!h.apply_header("content-type", "x").unwrap());
        assert_eq!(h.min_quality, Some(0.5));
        assert_eq!(h.tags, vec!["code", "math"]);
        assert!(matches!(
            h.apply_header(HEADER_MAX_COST, "cheap"),
            Err(HintError::NotANumber { .. })
        ));
        assert!(matches!(
            h.apply_header(HEADER_MIN_QUALITY, "1.5"),
            Err(HintError::OutOfRange { .. })
        ));
    }

    #[test]
    fn estimates_tokens_rounding_up() {
        assert_eq!(estimate_tokens(0), 0);
        assert_eq!(estimate_tokens(5), 2);
    }
}
