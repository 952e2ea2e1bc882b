//! `[[tenants]]`: keys, permissions, default hints and budgets.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use switchyard_seam::CacheScope;
use toml::Spanned;

use super::checks::{check_name, in_range, non_negative, positive, window_secs};
use super::names::Names;
use crate::compiled::rate_limit::RateLimits;
use crate::compiled::tenant::{Budget, Tenant};
use crate::error::Diagnostics;
use crate::keys::{self, KeyDigest};
use crate::request::Hints;
use crate::schema::{BudgetEntry, HintsEntry, RateLimitEntry, TenantEntry};
use crate::spend::BudgetUnit;

type Compiled = (
    Vec<Tenant>,
    HashMap<Box<str>, usize>,
    HashMap<KeyDigest, usize>,
);

pub(super) fn compile(
    entries: &[Spanned<TenantEntry>],
    names: &Names,
    env: &dyn Fn(&str) -> Option<String>,
    diags: &mut Diagnostics,
) -> Compiled {
    let mut tenants = Vec::with_capacity(entries.len());
    let mut by_name: HashMap<Box<str>, usize> = HashMap::new();
    let mut first_seen: HashMap<String, Range<usize>> = HashMap::new();
    let mut key_index: HashMap<KeyDigest, usize> = HashMap::new();
    let mut key_spans: HashMap<KeyDigest, Range<usize>> = HashMap::new();
    for (i, entry) in entries.iter().enumerate() {
        let e = entry.get_ref();
        let name = e.name.get_ref();
        check_name(&e.name, "tenant name", diags);
        if let Some(first) = first_seen.get(name) {
            let line = diags.line_of(first);
            diags.at(
                e.name.span(),
                format!("tenant `{name}` is already defined at line {line}"),
            );
        } else {
            first_seen.insert(name.clone(), e.name.span());
            by_name.insert(name.as_str().into(), i);
        }
        for spec in &e.api_keys {
            match keys::parse_key_spec(spec.get_ref(), env) {
                Ok(digest) => {
                    if let Some(first) = key_spans.get(&digest) {
                        let line = diags.line_of(first);
                        diags.at(
                            spec.span(),
                            format!("tenant `{name}`: this API key is already given at line {line}; each key must belong to one tenant"),
                        );
                    } else {
                        key_spans.insert(digest, spec.span());
                        key_index.insert(digest, i);
                    }
                }
                Err(msg) => diags.at(spec.span(), format!("tenant `{name}`: {msg}")),
            }
        }
        let tenant_name: Arc<str> = name.as_str().into();
        let budgets: Vec<Budget> = e
            .budgets
            .iter()
            .filter_map(|b| budget(b.get_ref(), b.span(), &tenant_name, diags))
            .collect();
        for (j, b) in budgets.iter().enumerate() {
            if budgets.iter().take(j).any(|o| o.same_window(b)) {
                // Reload carries counters over by (unit, window); two alike would merge.
                diags.at(
                    entry.span(),
                    format!(
                        "tenant `{name}` has two budgets of {}; keep one per unit and window",
                        b.label()
                    ),
                );
            }
        }
        tenants.push(Tenant {
            allowed: allowed(e, names, diags),
            default_hints: e
                .default_hints
                .as_ref()
                .map(|h| hints(h.get_ref(), name, diags))
                .unwrap_or_default(),
            budgets,
            cache_scope: cache_scope(e, &tenant_name, diags),
            weight: weight(e, &tenant_name, diags),
            kv_share: kv_share(e, &tenant_name, diags),
            rate_limits: rate_limits(e.rate_limits.as_ref(), &tenant_name, "rate_limits", diags),
            key_rate_limits: rate_limits(
                e.key_rate_limits.as_ref(),
                &tenant_name,
                "key_rate_limits",
                diags,
            ),
            name: tenant_name,
        });
    }
    (tenants, by_name, key_index)
}

/// The tenant's weight: a whole number from 1 to 1000.
fn weight(e: &TenantEntry, tenant: &str, diags: &mut Diagnostics) -> u32 {
    let Some(value) = &e.weight else { return 1 };
    let w = *value.get_ref();
    match u32::try_from(w) {
        Ok(w @ 1..=1000) => w,
        _ => {
            diags.at(
                value.span(),
                format!("tenant `{tenant}`: weight must be a whole number from 1 to 1000, got {w}"),
            );
            1
        }
    }
}

/// The tenant's part of the engine's KV budget: above 0, at most 1, kept in
/// thousandths (at least one).
fn kv_share(e: &TenantEntry, tenant: &str, diags: &mut Diagnostics) -> Option<u16> {
    let value = e.kv_share.as_ref()?;
    let share = *value.get_ref();
    if !(share > 0.0 && share <= 1.0) {
        diags.at(
            value.span(),
            format!("tenant `{tenant}`: kv_share must be above 0 and at most 1 (a part of the engine's KV budget), got {share}"),
        );
        return None;
    }
    // In 0 < share <= 1, so the product lies in 0..=1000.
    Some(((share * 1000.0).round() as u16).clamp(1, 1000))
}

/// Per-minute limits: each given one a whole number above 0.
fn rate_limits(
    entry: Option<&Spanned<RateLimitEntry>>,
    tenant: &str,
    field: &str,
    diags: &mut Diagnostics,
) -> RateLimits {
    let Some(entry) = entry else {
        return RateLimits::default();
    };
    let e = entry.get_ref();
    if e.requests_per_minute.is_none() && e.tokens_per_minute.is_none() {
        diags.at(
            entry.span(),
            format!("tenant `{tenant}`: {field} sets no limit; give requests_per_minute and/or tokens_per_minute, or leave it out"),
        );
    }
    let mut limit = |value: &Option<Spanned<i64>>, name: &str| {
        let value = value.as_ref()?;
        let n = *value.get_ref();
        if n <= 0 {
            diags.at(
                value.span(),
                format!("tenant `{tenant}`: {field}.{name} must be above 0, got {n}"),
            );
            return None;
        }
        u64::try_from(n).ok()
    };
    RateLimits {
        requests_per_minute: limit(&e.requests_per_minute, "requests_per_minute"),
        tokens_per_minute: limit(&e.tokens_per_minute, "tokens_per_minute"),
    }
}

/// The tenant's own scope, or the shared one its entry names.
fn cache_scope(e: &TenantEntry, tenant: &Arc<str>, diags: &mut Diagnostics) -> CacheScope {
    match &e.cache_scope {
        None => CacheScope::tenant(Arc::clone(tenant)),
        Some(name) => {
            check_name(name, &format!("tenant `{tenant}`: cache_scope"), diags);
            CacheScope::shared(name.get_ref().as_str())
        }
    }
}

fn allowed(e: &TenantEntry, names: &Names, diags: &mut Diagnostics) -> Option<Vec<bool>> {
    let list = e.allowed_models.as_ref()?;
    if list.iter().any(|m| m.get_ref() == "*") {
        return None;
    }
    let mut allowed = vec![false; names.models.len()];
    for m in list {
        match names.model(m.get_ref()) {
            Ok(i) => {
                if let Some(slot) = allowed.get_mut(i) {
                    *slot = true;
                }
            }
            Err(msg) => diags.at(
                m.span(),
                format!("tenant `{}`: allowed_models: {msg}", e.name.get_ref()),
            ),
        }
    }
    Some(allowed)
}

fn hints(h: &HintsEntry, tenant: &str, diags: &mut Diagnostics) -> Hints {
    let field = |f: &str| format!("tenant `{tenant}`: default_hints.{f}");
    if let Some(q) = &h.min_quality {
        in_range(q, 0.0, 1.0, &field("min_quality"), diags);
    }
    if let Some(c) = &h.max_cost {
        non_negative(c, &field("max_cost"), diags);
    }
    if let Some(l) = &h.max_latency_ms {
        positive(l, &field("max_latency_ms"), diags);
    }
    Hints {
        min_quality: h.min_quality.as_ref().map(|v| *v.get_ref()),
        max_cost: h.max_cost.as_ref().map(|v| *v.get_ref()),
        max_latency_ms: h.max_latency_ms.as_ref().map(|v| *v.get_ref()),
        tags: h.tags.clone(),
    }
}

fn budget(
    b: &BudgetEntry,
    span: Range<usize>,
    tenant: &Arc<str>,
    diags: &mut Diagnostics,
) -> Option<Budget> {
    let secs = window_secs(
        &b.window,
        &format!("tenant `{tenant}`: budget window"),
        diags,
    );
    let (unit, limit) = match (&b.limit_tokens, &b.limit_cost) {
        (Some(t), None) => {
            if *t.get_ref() <= 0 {
                diags.at(
                    t.span(),
                    format!(
                        "tenant `{tenant}`: limit_tokens must be above 0, got {}",
                        t.get_ref()
                    ),
                );
                return None;
            }
            (BudgetUnit::Tokens, *t.get_ref() as f64)
        }
        (None, Some(c)) => {
            if !positive(c, &format!("tenant `{tenant}`: limit_cost"), diags) {
                return None;
            }
            (BudgetUnit::Cost, *c.get_ref())
        }
        _ => {
            diags.at(
                span,
                format!("tenant `{tenant}`: a budget needs exactly one of `limit_tokens` or `limit_cost`; use two budgets to limit both"),
            );
            return None;
        }
    };
    Some(Budget::new(unit, secs?, limit))
}
