//! Turns a parsed [`PolicyFile`] into a [`CompiledPolicy`], checking the whole file and
//! reporting every problem with its line and column. Nothing is half-loaded: any problem
//! fails it.

mod cascade;
mod checks;
mod models;
mod names;
mod recover;
mod tenants;
mod traffic;

use toml::Spanned;

use crate::compiled::scan_table::ScanTable;
use crate::compiled::tags::TagTable;
use crate::compiled::{CompiledPolicy, Routing};
use crate::error::{Diagnostics, PolicyError};
use crate::schema::RoutingEntry;
use checks::non_negative;
use names::Names;

/// Parses and validates `src` (named `source_name` in errors).
pub(crate) fn compile(
    src: &str,
    source_name: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<CompiledPolicy, PolicyError> {
    let mut diags = Diagnostics::new(src);
    // Past TOML errors too, so that one check reports every typo (see `recover`).
    let Some(file) = recover::parse(src, &mut diags) else {
        return Err(diags.into_error(source_name));
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
    let cascade = cascade::cascade(file.cascade.as_ref(), &names, &mut diags);
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
        cascade,
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
