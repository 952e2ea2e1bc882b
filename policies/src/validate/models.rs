//! `[[models]]`: names, aliases, versions and economics.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use toml::Spanned;

use super::checks::{check_name, in_range, non_negative, positive};
use crate::compiled::model::{Model, QualityFrom};
use crate::error::Diagnostics;
use crate::schema::ModelEntry;

/// Builds the models and the name/alias index. Models with problems are still returned
/// (so later sections can resolve references) but the diagnostics fail the load.
pub(super) fn compile(
    entries: &[Spanned<ModelEntry>],
    diags: &mut Diagnostics,
) -> (Vec<Model>, HashMap<Box<str>, usize>) {
    let mut models = Vec::with_capacity(entries.len());
    let mut index: HashMap<Box<str>, usize> = HashMap::new();
    let mut seen: HashMap<String, Range<usize>> = HashMap::new();
    for (i, entry) in entries.iter().enumerate() {
        let e = entry.get_ref();
        let name = e.name.get_ref();
        check_name(&e.name, "model name", diags);
        for label in std::iter::once(&e.name).chain(&e.aliases) {
            if !std::ptr::eq(label, &e.name) {
                check_name(label, &format!("alias of model `{name}`"), diags);
            }
            let text = label.get_ref();
            if let Some(first) = seen.get(text) {
                let line = diags.line_of(first);
                diags.at(
                    label.span(),
                    format!("`{text}` is already a model name or alias (line {line}); names and aliases must be unique"),
                );
            } else {
                seen.insert(text.clone(), label.span());
                index.insert(text.as_str().into(), i);
            }
        }
        let versions = versions(e, diags);
        let active_version = active_version(e, &versions, diags);
        non_negative(
            &e.cost_per_1k_input,
            &format!("model `{name}`: cost_per_1k_input"),
            diags,
        );
        non_negative(
            &e.cost_per_1k_output,
            &format!("model `{name}`: cost_per_1k_output"),
            diags,
        );
        if let Some(q) = &e.quality {
            in_range(q, 0.0, 1.0, &format!("model `{name}`: quality"), diags);
        } else if e.quality_from.is_none() {
            diags.at(
                e.name.span(),
                format!("model `{name}` has no quality; add `quality = 0.7`, or `quality_from = \"<suite>\"` to take it from a measurement (switchyard eval --save)"),
            );
        }
        let mut quality_by_tag = Vec::with_capacity(e.quality_by_tag.len());
        for (tag, q) in &e.quality_by_tag {
            in_range(
                q,
                0.0,
                1.0,
                &format!("model `{name}`: quality_by_tag.{tag}"),
                diags,
            );
            // BTreeMap order: the vector ends up sorted by tag.
            quality_by_tag.push((tag.clone(), *q.get_ref()));
        }
        let quality_from = quality_from(e, &quality_by_tag, diags);
        if *e.context_limit.get_ref() == 0 {
            diags.at(
                e.context_limit.span(),
                format!("model `{name}`: context_limit must be above 0 (the most prompt + output tokens it accepts)"),
            );
        }
        if let Some(t) = &e.latency_target_ms {
            positive(t, &format!("model `{name}`: latency_target_ms"), diags);
        }
        if let Some(q) = &e.max_queue_depth {
            if *q.get_ref() == 0 {
                diags.at(
                    q.span(),
                    format!(
                        "model `{name}`: max_queue_depth must be above 0, or left out for no limit"
                    ),
                );
            }
        }
        models.push(Model {
            name: name.as_str().into(),
            versions,
            active_version,
            aliases: e
                .aliases
                .iter()
                .map(|a| Arc::from(a.get_ref().as_str()))
                .collect(),
            cost_per_1k_input: *e.cost_per_1k_input.get_ref(),
            cost_per_1k_output: *e.cost_per_1k_output.get_ref(),
            quality: e.quality.as_ref().map_or(0.0, |q| *q.get_ref()),
            quality_by_tag,
            context_limit: *e.context_limit.get_ref(),
            latency_target_ms: e.latency_target_ms.as_ref().map(|t| *t.get_ref()),
            max_queue_depth: e.max_queue_depth.as_ref().map(|q| *q.get_ref()),
            split: None,
            fallback: None,
            quality_from,
        });
    }
    (models, index)
}

/// `quality_from` and `quality_from_by_tag`: suite names (file stems, as
/// `switchyard eval --save` stores them).
fn quality_from(
    e: &ModelEntry,
    declared_by_tag: &[(String, f64)],
    diags: &mut Diagnostics,
) -> Option<QualityFrom> {
    if e.quality_from.is_none() && e.quality_from_by_tag.is_empty() {
        return None;
    }
    let name = e.name.get_ref();
    let suites = e
        .quality_from
        .iter()
        .map(|s| (String::from("quality_from"), s))
        .chain(
            e.quality_from_by_tag
                .iter()
                .map(|(tag, s)| (format!("quality_from_by_tag.{tag}"), s)),
        );
    for (field, suite) in suites {
        let text = suite.get_ref();
        if text.is_empty() || text.contains(['/', '\\']) || text.ends_with(".jsonl") {
            diags.at(
                suite.span(),
                format!("model `{name}`: {field} names a suite by its name (the file stem, e.g. `geo` for evals/geo.jsonl), got `{text}`"),
            );
        }
    }
    Some(QualityFrom {
        suite: e.quality_from.as_ref().map(|s| s.get_ref().clone()),
        by_tag: e
            .quality_from_by_tag
            .iter()
            .map(|(tag, s)| (tag.clone(), s.get_ref().clone()))
            .collect(),
        declared: e.quality.as_ref().map(|q| *q.get_ref()),
        declared_by_tag: declared_by_tag.to_vec(),
        origins: Vec::new(),
    })
}

fn versions(e: &ModelEntry, diags: &mut Diagnostics) -> Vec<Arc<str>> {
    let name = e.name.get_ref();
    let list: Vec<&Spanned<String>> = match (&e.version, &e.versions) {
        (Some(v), None) => vec![v],
        (None, Some(vs)) if !vs.get_ref().is_empty() => vs.get_ref().iter().collect(),
        (None, Some(vs)) => {
            diags.at(
                vs.span(),
                format!("model `{name}`: versions must list at least one version"),
            );
            return Vec::new();
        }
        (Some(v), Some(_)) => {
            diags.at(
                v.span(),
                format!("model `{name}`: give either `version` or `versions`, not both"),
            );
            return Vec::new();
        }
        (None, None) => {
            diags.at(
                e.name.span(),
                format!("model `{name}` has no version; add `version = \"v1\"` or `versions = [\"v1\", \"v2\"]`"),
            );
            return Vec::new();
        }
    };
    let mut out: Vec<Arc<str>> = Vec::with_capacity(list.len());
    for v in list {
        check_name(v, &format!("version of model `{name}`"), diags);
        if out.iter().any(|o| **o == **v.get_ref()) {
            diags.at(
                v.span(),
                format!("model `{name}`: version `{}` is listed twice", v.get_ref()),
            );
        } else {
            out.push(v.get_ref().as_str().into());
        }
    }
    out
}

/// The version served when no split or pin applies: `active_version`, else the last listed.
fn active_version(e: &ModelEntry, versions: &[Arc<str>], diags: &mut Diagnostics) -> usize {
    let last = versions.len().saturating_sub(1);
    let Some(active) = &e.active_version else {
        return last;
    };
    match versions.iter().position(|v| **v == **active.get_ref()) {
        Some(i) => i,
        None => {
            diags.at(
                active.span(),
                format!(
                    "model `{}`: active_version `{}` is not among its versions ({})",
                    e.name.get_ref(),
                    active.get_ref(),
                    versions.iter().map(|v| &**v).collect::<Vec<_>>().join(", ")
                ),
            );
            last
        }
    }
}
