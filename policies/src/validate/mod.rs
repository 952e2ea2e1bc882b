//! Turns a parsed [`PolicyFile`] into a [`CompiledPolicy`], checking the whole file and
//! reporting every problem with its line and column. Nothing is half-loaded: any problem
//! fails it.

mod models;
mod tenants;
mod traffic;

use std::collections::HashMap;

use toml::Spanned;

use crate::compiled::model::{Model, Target};
use crate::compiled::scan_table::ScanTable;
use crate::compiled::tags::TagTable;
use crate::compiled::{CompiledPolicy, Routing};
use crate::error::{Diagnostics, PolicyError};
use crate::schema::{PolicyFile, RoutingEntry};

/// Parses and validates `src` (named `source_name` in errors).
pub(crate) fn compile(
    src: &str,
    source_name: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<CompiledPolicy, PolicyError> {
    let mut diags = Diagnostics::new(src);
    let file: PolicyFile = match toml::from_str(src) {
        Ok(file) => file,
        Err(e) => {
            diags.at(e.span().unwrap_or(0..0), e.message().trim().to_string());
            return Err(diags.into_error(source_name));
        }
    };
    let routing = routing(file.routing.as_ref(), &mut diags);
    let (mut models, model_names) = models::compile(&file.models, &mut diags);
    let names = Names {
        models: &models,
        index: &model_names,
    };
    let (tenants, tenant_names, keys) = tenants::compile(&file.tenants, &names, env, &mut diags);
    let splits = traffic::splits(&file.splits, &names, &mut diags);
    let fallbacks = traffic::fallbacks(&file.fallbacks, &names, &mut diags);
    if !diags.is_empty() {
        return Err(diags.into_error(source_name));
    }
    for (i, split) in splits.iter().enumerate() {
        if let Some(m) = models.get_mut(split.model) {
            m.split = Some(i);
        }
    }
    for (model, fallback) in fallbacks {
        if let Some(m) = models.get_mut(model) {
            m.fallback = Some(fallback);
        }
    }
    let mut checkpoint_base = Vec::with_capacity(models.len());
    let mut checkpoint_count = 0;
    for m in &models {
        checkpoint_base.push(checkpoint_count);
        checkpoint_count += m.versions.len();
    }
    let cross_model_arms = splits
        .iter()
        .any(|s| s.arms.iter().any(|a| a.model != s.model));
    Ok(CompiledPolicy {
        tags: TagTable::new(&models),
        scan: ScanTable::new(&models),
        cross_model_arms,
        checkpoint_base,
        checkpoint_count,
        source_name: source_name.to_string(),
        routing,
        models,
        model_names,
        tenants,
        tenant_names,
        keys,
        splits,
    })
}

fn routing(entry: Option<&Spanned<RoutingEntry>>, diags: &mut Diagnostics) -> Routing {
    let mut r = Routing::default();
    let Some(entry) = entry else { return r };
    let e = entry.get_ref();
    for (field, value, slot) in [
        ("quality_weight", &e.quality_weight, &mut r.quality_weight),
        ("cost_weight", &e.cost_weight, &mut r.cost_weight),
        ("latency_weight", &e.latency_weight, &mut r.latency_weight),
    ] {
        if let Some(v) = value {
            if non_negative(v, &format!("routing.{field}"), diags) {
                *slot = *v.get_ref();
            }
        }
    }
    if let Some(t) = &e.assumed_output_tokens {
        r.assumed_output_tokens = *t.get_ref();
    }
    r.allow_anonymous = e.allow_anonymous;
    r
}

/// Model lookup shared by the tenant, split and fallback checks.
pub(super) struct Names<'a> {
    pub models: &'a [Model],
    pub index: &'a HashMap<Box<str>, usize>,
}

impl Names<'_> {
    /// A model by name or alias, or an error listing the known names.
    pub fn model(&self, name: &str) -> Result<usize, String> {
        self.index.get(name).copied().ok_or_else(|| {
            let mut known: Vec<&str> = self.models.iter().map(|m| &*m.name).collect();
            known.sort_unstable();
            format!(
                "unknown model `{name}`; define it under [[models]] or use one of: {}",
                known.join(", ")
            )
        })
    }

    /// `name`, `alias` or `name@version`.
    pub fn target(&self, spec: &str) -> Result<Target, String> {
        let Some((name, version)) = spec.split_once('@') else {
            return Ok(Target {
                model: self.model(spec)?,
                version: None,
            });
        };
        let model = self.model(name)?;
        let versions = self.models.get(model).map_or(&[][..], |m| &m.versions[..]);
        match versions.iter().position(|v| &**v == version) {
            Some(v) => Ok(Target {
                model,
                version: Some(v),
            }),
            None => Err(format!(
                "model `{name}` has no version `{version}`; its versions are: {}",
                versions.iter().map(|v| &**v).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// The concrete version a target resolves to when no split applies.
    pub fn version_of(&self, target: Target) -> usize {
        target.version.unwrap_or_else(|| {
            self.models
                .get(target.model)
                .map_or(0, |m| m.active_version)
        })
    }
}

/// Checks a name used for models, aliases, versions, tenants, splits and arms.
pub(super) fn check_name(name: &Spanned<String>, what: &str, diags: &mut Diagnostics) -> bool {
    let n = name.get_ref();
    let problem = if n.is_empty() {
        Some("must not be empty".to_string())
    } else if n.contains('@') || n.contains(char::is_whitespace) || n.contains(',') {
        Some(format!("`{n}` must not contain `@`, `,` or whitespace"))
    } else if n.eq_ignore_ascii_case("auto") {
        Some("`auto` is reserved for automatic routing; pick another name".to_string())
    } else {
        None
    };
    if let Some(p) = &problem {
        diags.at(name.span(), format!("{what}: {p}"));
    }
    problem.is_none()
}

/// Checks `v >= 0` and finite.
pub(super) fn non_negative(v: &Spanned<f64>, field: &str, diags: &mut Diagnostics) -> bool {
    let x = *v.get_ref();
    let ok = x.is_finite() && x >= 0.0;
    if !ok {
        diags.at(
            v.span(),
            format!("{field} must be a finite number of 0 or more, got {x}"),
        );
    }
    ok
}

/// Checks `lo <= v <= hi`.
pub(super) fn in_range(
    v: &Spanned<f64>,
    lo: f64,
    hi: f64,
    field: &str,
    diags: &mut Diagnostics,
) -> bool {
    let x = *v.get_ref();
    let ok = (lo..=hi).contains(&x);
    if !ok {
        diags.at(
            v.span(),
            format!("{field} must lie between {lo} and {hi}, got {x}"),
        );
    }
    ok
}

/// Checks `v > 0` and finite.
pub(super) fn positive(v: &Spanned<f64>, field: &str, diags: &mut Diagnostics) -> bool {
    let x = *v.get_ref();
    let ok = x.is_finite() && x > 0.0;
    if !ok {
        diags.at(
            v.span(),
            format!("{field} must be a finite number above 0, got {x}"),
        );
    }
    ok
}

/// Parses a window such as `90s`, `15m`, `1h`, `1d` or `1w` into seconds.
pub(super) fn window_secs(
    w: &Spanned<String>,
    field: &str,
    diags: &mut Diagnostics,
) -> Option<u64> {
    let text = w.get_ref().trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let scale = match unit {
        "s" => Some(1),
        "m" => Some(60),
        "h" => Some(3600),
        "d" => Some(86_400),
        "w" => Some(604_800),
        _ => None,
    };
    match (digits.parse::<u64>(), scale) {
        (Ok(n), Some(scale)) if n > 0 => n.checked_mul(scale).or_else(|| {
            diags.at(w.span(), format!("{field} `{text}` is too long"));
            None
        }),
        _ => {
            diags.at(
                w.span(),
                format!("{field} `{text}` is not a window; write a whole number and a unit: s, m, h, d or w (e.g. `1h`)"),
            );
            None
        }
    }
}
