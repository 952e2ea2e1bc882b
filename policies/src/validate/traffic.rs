//! `[[splits]]` and `[[fallbacks]]`: where traffic goes between versions and models.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::checks::{check_name, in_range, non_negative, positive, window_secs};
use super::names::Names;
use crate::compiled::model::{Fallback, Triggers};
use crate::compiled::split::{Arm, EvalDrop, RollbackRule, Split, Sticky};
use crate::error::Diagnostics;
use crate::schema::{
    ArmEntry, FallbackEntry, RollbackEntry, SplitEntry, StickyEntry, TriggerEntry,
};

/// Weights are percentages; this much rounding slack is accepted.
const WEIGHT_SLACK: f64 = 1e-6;

pub(super) fn splits(
    entries: &[Spanned<SplitEntry>],
    names: &Names,
    diags: &mut Diagnostics,
) -> Vec<Split> {
    let mut out = Vec::with_capacity(entries.len());
    let mut seen_names: HashMap<String, Range<usize>> = HashMap::new();
    let mut seen_models: HashMap<usize, Range<usize>> = HashMap::new();
    for entry in entries {
        let e = entry.get_ref();
        let name = e.name.get_ref();
        check_name(&e.name, "split name", diags);
        if let Some(first) = seen_names.get(name) {
            let line = diags.line_of(first);
            diags.at(
                e.name.span(),
                format!("split `{name}` is already defined at line {line}"),
            );
        } else {
            seen_names.insert(name.clone(), e.name.span());
        }
        let model = match names.model(e.model.get_ref()) {
            Ok(m) => m,
            Err(msg) => {
                diags.at(e.model.span(), format!("split `{name}`: {msg}"));
                continue;
            }
        };
        if let Some(first) = seen_models.get(&model) {
            let line = diags.line_of(first);
            diags.at(
                e.model.span(),
                format!("split `{name}`: model `{}` already has a split at line {line}; a model takes one split", e.model.get_ref()),
            );
        } else {
            seen_models.insert(model, e.model.span());
        }
        let arms = arms(name, &e.arms, names, diags);
        let rollback = e
            .rollback
            .as_ref()
            .and_then(|r| rollback(name, r.get_ref(), &arms, diags));
        let sticky = match e.sticky {
            StickyEntry::User => Sticky::User,
            StickyEntry::Key => Sticky::Key,
            StickyEntry::None => Sticky::None,
        };
        out.push(Split::new(
            name.as_str().into(),
            model,
            sticky,
            arms,
            rollback,
        ));
    }
    out
}

fn arms(
    split: &str,
    list: &Spanned<Vec<Spanned<ArmEntry>>>,
    names: &Names,
    diags: &mut Diagnostics,
) -> Vec<Arm> {
    if list.get_ref().len() < 2 {
        diags.at(
            list.span(),
            format!("split `{split}` needs at least two arms (e.g. stable and canary)"),
        );
    }
    let mut arms: Vec<Arm> = Vec::with_capacity(list.get_ref().len());
    let mut total = 0.0;
    for a in list.get_ref() {
        let a = a.get_ref();
        check_name(&a.name, &format!("split `{split}`: arm name"), diags);
        if arms.iter().any(|o| *o.name == **a.name.get_ref()) {
            diags.at(
                a.name.span(),
                format!(
                    "split `{split}`: arm `{}` is defined twice",
                    a.name.get_ref()
                ),
            );
        }
        non_negative(
            &a.weight,
            &format!("split `{split}`: weight of arm `{}`", a.name.get_ref()),
            diags,
        );
        total += *a.weight.get_ref();
        match names.target(a.target.get_ref()) {
            Ok(t) => arms.push(Arm {
                name: a.name.get_ref().as_str().into(),
                model: t.model,
                version: names.version_of(t),
                weight: *a.weight.get_ref(),
            }),
            Err(msg) => diags.at(
                a.target.span(),
                format!("split `{split}`: arm `{}`: {msg}", a.name.get_ref()),
            ),
        }
    }
    if (total - 100.0).abs() > WEIGHT_SLACK && total.is_finite() {
        diags.at(
            list.span(),
            format!("split `{split}`: arm weights are percentages and must sum to 100, but they sum to {total}"),
        );
    }
    arms
}

fn rollback(
    split: &str,
    r: &RollbackEntry,
    arms: &[Arm],
    diags: &mut Diagnostics,
) -> Option<RollbackRule> {
    let arm_index = |n: &Spanned<String>, diags: &mut Diagnostics| {
        let found = arms.iter().position(|a| *a.name == **n.get_ref());
        if found.is_none() {
            diags.at(
                n.span(),
                format!(
                    "split `{split}`: rollback names arm `{}`, which is not one of: {}",
                    n.get_ref(),
                    arms.iter().map(|a| &*a.name).collect::<Vec<_>>().join(", ")
                ),
            );
        }
        found
    };
    let baseline = arm_index(&r.baseline, diags);
    let candidate = arm_index(&r.candidate, diags);
    if baseline.is_some() && baseline == candidate {
        diags.at(
            r.candidate.span(),
            format!("split `{split}`: rollback baseline and candidate must be different arms"),
        );
    }
    let window = window_secs(
        &r.window,
        &format!("split `{split}`: rollback window"),
        diags,
    );
    if *r.min_samples.get_ref() == 0 {
        diags.at(
            r.min_samples.span(),
            format!("split `{split}`: rollback min_samples must be at least 1"),
        );
    }
    if let Some(e) = &r.max_error_rate_increase {
        in_range(
            e,
            0.0,
            1.0,
            &format!("split `{split}`: max_error_rate_increase"),
            diags,
        );
    }
    if let Some(l) = &r.max_latency_ratio {
        positive(l, &format!("split `{split}`: max_latency_ratio"), diags);
    }
    if let Some(d) = &r.max_confidence_drop {
        positive(d, &format!("split `{split}`: max_confidence_drop"), diags);
    }
    if let Some(d) = &r.max_feedback_drop {
        in_range(
            d,
            0.0,
            1.0,
            &format!("split `{split}`: max_feedback_drop"),
            diags,
        );
    }
    let eval = eval_drop(split, r, diags);
    let rules = [
        r.max_error_rate_increase.is_some(),
        r.max_latency_ratio.is_some(),
        r.max_confidence_drop.is_some(),
        r.max_feedback_drop.is_some(),
        r.max_eval_drop.is_some(),
    ];
    if !rules.contains(&true) {
        diags.at(
            r.baseline.span(),
            format!("split `{split}`: a rollback rule needs at least one of max_error_rate_increase, max_latency_ratio, max_confidence_drop, max_feedback_drop, max_eval_drop"),
        );
    }
    let (baseline, candidate) = (baseline?, candidate?);
    Some(RollbackRule {
        baseline,
        candidate,
        window: Duration::from_secs(window?),
        min_samples: *r.min_samples.get_ref(),
        max_error_rate_increase: r.max_error_rate_increase.as_ref().map(|v| *v.get_ref()),
        max_latency_ratio: r.max_latency_ratio.as_ref().map(|v| *v.get_ref()),
        max_confidence_drop: r.max_confidence_drop.as_ref().map(|v| *v.get_ref()),
        max_feedback_drop: r.max_feedback_drop.as_ref().map(|v| *v.get_ref()),
        eval,
    })
}

/// `eval_suite` and `max_eval_drop`: both or neither.
fn eval_drop(split: &str, r: &RollbackEntry, diags: &mut Diagnostics) -> Option<EvalDrop> {
    match (&r.eval_suite, &r.max_eval_drop) {
        (Some(suite), Some(drop)) => {
            in_range(
                drop,
                0.0,
                1.0,
                &format!("split `{split}`: max_eval_drop"),
                diags,
            );
            if suite.get_ref().trim().is_empty() {
                diags.at(
                    suite.span(),
                    format!("split `{split}`: eval_suite must name a suite"),
                );
            }
            Some(EvalDrop {
                suite: suite.get_ref().clone(),
                max_drop: *drop.get_ref(),
            })
        }
        (Some(suite), None) => {
            diags.at(
                suite.span(),
                format!("split `{split}`: eval_suite needs max_eval_drop (the accuracy drop that rolls the candidate back)"),
            );
            None
        }
        (None, Some(drop)) => {
            diags.at(
                drop.span(),
                format!("split `{split}`: max_eval_drop needs eval_suite (the suite both arms are measured on)"),
            );
            None
        }
        (None, None) => None,
    }
}

pub(super) fn fallbacks(
    entries: &[Spanned<FallbackEntry>],
    names: &Names,
    diags: &mut Diagnostics,
) -> Vec<(usize, Fallback)> {
    let mut out: Vec<(usize, Fallback)> = Vec::with_capacity(entries.len());
    for entry in entries {
        let e = entry.get_ref();
        let model = match names.model(e.model.get_ref()) {
            Ok(m) => m,
            Err(msg) => {
                diags.at(e.model.span(), format!("fallbacks: {msg}"));
                continue;
            }
        };
        if out.iter().any(|(m, _)| *m == model) {
            diags.at(
                e.model.span(),
                format!(
                    "fallbacks for model `{}` are given twice; merge them into one list",
                    e.model.get_ref()
                ),
            );
        }
        let on = match &e.on {
            None => Triggers {
                overloaded: true,
                failing: true,
                over_budget: true,
            },
            Some(list) if list.is_empty() => {
                diags.at(e.model.span(), "fallbacks: `on` is empty; list overloaded, failing and/or over_budget, or leave it out for all three");
                continue;
            }
            Some(list) => Triggers {
                overloaded: list.contains(&TriggerEntry::Overloaded),
                failing: list.contains(&TriggerEntry::Failing),
                over_budget: list.contains(&TriggerEntry::OverBudget),
            },
        };
        if e.alternatives.get_ref().is_empty() {
            diags.at(
                e.alternatives.span(),
                "fallbacks: alternatives must list at least one model or model@version",
            );
        }
        let mut alternatives = Vec::with_capacity(e.alternatives.get_ref().len());
        for alt in e.alternatives.get_ref() {
            match names.target(alt.get_ref()) {
                Ok(t) if t.model == model && t.version.is_none() => diags.at(
                    alt.span(),
                    format!(
                        "fallbacks: model `{}` cannot fall back to itself",
                        e.model.get_ref()
                    ),
                ),
                Ok(t) => alternatives.push(t),
                Err(msg) => diags.at(
                    alt.span(),
                    format!("fallbacks for `{}`: {msg}", e.model.get_ref()),
                ),
            }
        }
        out.push((model, Fallback { on, alternatives }));
    }
    out
}
