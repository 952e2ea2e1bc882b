//! The candidate set of one request, from its `model` hint: every model for `auto`, the
//! named model's split arm or active version, or the pinned checkpoint; plus the
//! requested model's fallbacks.

use std::borrow::Cow;

use crate::authenticate::TenantRef;
use crate::compiled::model::Model;
use crate::compiled::split::Sticky;
use crate::constraint::Trigger;
use crate::context::Context;
use crate::engine_view::EngineView;
use crate::policy::Policy;
use crate::request::{Caller, ModelHint, RouteRequest};
use crate::route_error::RouteError;
use crate::route_reason::RouteReason;
use crate::scan::{self, BLOCK};
use crate::score::{
    live_utility, order, pick_order, qualifying_utility, score, Detail, Scored, Via,
};

/// The candidate set a request's `model` hint asks for.
pub(crate) struct Plan<'a> {
    policy: &'a Policy,
    hint: &'a ModelHint,
    reason: RouteReason,
    /// The requested model (not under `auto`).
    pub(crate) requested: Option<usize>,
    candidates: Candidates,
    /// What sticky splits hash for this request.
    sticky: StickyKey<'a>,
}

/// One candidate checkpoint: model index, version index, and how it entered.
type Candidate = (usize, usize, Via);

/// The candidate set, kept small: under `auto` a request must not copy a row per model
/// (with a hundred models that was a 4 KB allocation per request, from the allocator's
/// slow path for large chunks).
enum Candidates {
    /// Every model once, in model order: its active version, or the arm its split
    /// assigns this request. Arms are resolved only for the models a scan reaches (a
    /// sticky assignment is a hash of the request's key: the same every time it is
    /// asked), so a model the policy's constraints rule out costs no hashing.
    EveryModel,
    /// An explicit list.
    Listed(Vec<Candidate>),
}

/// Iterates [`Candidates`].
enum CandidateIter<'a> {
    EveryModel {
        models: std::iter::Enumerate<std::slice::Iter<'a, Model>>,
        policy: &'a Policy,
        sticky: &'a StickyKey<'a>,
    },
    Listed(std::slice::Iter<'a, Candidate>),
}

impl Iterator for CandidateIter<'_> {
    type Item = Candidate;

    fn next(&mut self) -> Option<Candidate> {
        match self {
            CandidateIter::Listed(list) => list.next().copied(),
            CandidateIter::EveryModel {
                models,
                policy,
                sticky,
            } => loop {
                let (i, m) = models.next()?;
                if m.split.is_none() {
                    return Some((i, m.active_version, Via::Direct));
                }
                // A split whose arm does not resolve leaves its model out.
                if let Some(arm) = resolve_named(policy, i, sticky) {
                    return Some(arm);
                }
            },
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            CandidateIter::Listed(list) => list.size_hint(),
            CandidateIter::EveryModel { models, .. } => (0, models.size_hint().1),
        }
    }
}

impl<'a> Plan<'a> {
    pub fn new(
        policy: &'a Policy,
        req: &'a RouteRequest,
        tenant: Option<TenantRef<'a>>,
    ) -> Result<Self, RouteError> {
        let sticky = StickyKey { req, tenant };
        let (reason, requested, candidates) = match &req.model {
            ModelHint::Auto => (RouteReason::Auto, None, every_model(policy, &sticky)),
            ModelHint::Named { name } => {
                let i = model_named(policy, name)?;
                let reason = match policy.compiled.models.get(i) {
                    Some(m) if *m.name == **name => RouteReason::Named,
                    _ => RouteReason::Alias,
                };
                (
                    reason,
                    Some(i),
                    Candidates::Listed(resolve_named(policy, i, &sticky).into_iter().collect()),
                )
            }
            ModelHint::Pinned { name, version } => {
                let i = model_named(policy, name)?;
                let versions = policy
                    .compiled
                    .models
                    .get(i)
                    .map_or(&[][..], |m| &m.versions[..]);
                let v = versions
                    .iter()
                    .position(|v| **v == **version)
                    .ok_or_else(|| RouteError::UnknownVersion {
                        model: name.clone(),
                        version: version.clone(),
                        known: versions.iter().map(|v| &**v).collect::<Vec<_>>().join(", "),
                    })?;
                (
                    RouteReason::Pinned,
                    Some(i),
                    Candidates::Listed(vec![(i, v, Via::Direct)]),
                )
            }
        };
        Ok(Plan {
            policy,
            hint: &req.model,
            reason,
            requested,
            candidates,
            sticky,
        })
    }

    /// The candidates, in model order under `auto`.
    fn candidates(&self) -> CandidateIter<'_> {
        match &self.candidates {
            Candidates::EveryModel => CandidateIter::EveryModel {
                models: self.policy.compiled.models.iter().enumerate(),
                policy: self.policy,
                sticky: &self.sticky,
            },
            Candidates::Listed(list) => CandidateIter::Listed(list.iter()),
        }
    }

    pub fn ranked(&self) -> bool {
        self.requested.is_none()
    }

    /// Scores the primary candidates. Under `auto` with [`Detail::Verdict`] only the
    /// verdicts are kept; a named model always gets full detail (its failures decide
    /// whether fallbacks apply).
    pub fn score_primary(
        &self,
        ctx: &Context,
        engine: &dyn EngineView,
        detail: Detail,
    ) -> Vec<Scored> {
        let detail = if self.ranked() { detail } else { Detail::All };
        // Sized up front: growing a vector of scores copies them all at each doubling.
        let mut scored = Vec::with_capacity(self.candidates().size_hint().1.unwrap_or(0));
        scored.extend(
            self.candidates()
                // Under Verdict, rejected candidates come back as `None`.
                .filter_map(|(m, v, via)| score(ctx, m, v, via, engine, detail)),
        );
        scored
    }

    /// Under `auto`: the best qualifying candidate (in [`pick_order`]) and how many
    /// qualify, keeping no other score. The common case needs nothing more; a pick whose
    /// budget reservation then fails goes through [`Plan::score_primary`] and `select`.
    pub fn best_primary(&self, ctx: &Context, engine: &dyn EngineView) -> (Option<Scored>, usize) {
        // The scan keeps one utility per candidate; only the winner is scored in full.
        let mut best: Option<(f64, usize, usize, Via)> = None;
        let mut qualifying = 0;
        let mut consider = |utility: f64, (m, v, via): Candidate| {
            qualifying += 1;
            if best.is_none_or(|(bu, bm, bv, _)| {
                order(self.policy, (utility, m, v), (bu, bm, bv)).is_lt()
            }) {
                best = Some((utility, m, v, via));
            }
        };
        match &self.candidates {
            Candidates::EveryModel => self.scan_every_model(ctx, engine, &mut consider),
            Candidates::Listed(list) => {
                for &(m, v, via) in list {
                    if let Some(utility) = qualifying_utility(ctx, m, v, engine) {
                        consider(utility, (m, v, via));
                    }
                }
            }
        }
        let Some((_, m, v, via)) = best else {
            return (None, 0);
        };
        match score(ctx, m, v, via, engine, Detail::Verdict) {
            Some(winner) => (Some(winner), qualifying),
            // Live engine state changed between the two reads: scan again in full.
            None => self.best_primary_scored(ctx, engine),
        }
    }

    /// Under `auto` (each model's checkpoints its own): every model's candidate that
    /// qualifies, with its utility, in model order. The policy-and-request constraints
    /// are decided a block of models at a time ([`scan::pass`]); only the models
    /// that pass them read live engine state.
    fn scan_every_model(
        &self,
        ctx: &Context,
        engine: &dyn EngineView,
        consider: &mut impl FnMut(f64, Candidate),
    ) {
        let models = &self.policy.compiled.models;
        for start in (0..models.len()).step_by(BLOCK) {
            let pass = scan::pass(ctx, start);
            let mut passed = pass.passed;
            while passed != 0 {
                let j = passed.trailing_zeros() as usize;
                passed &= passed - 1;
                let i = start + j;
                let Some(m) = models.get(i) else { break };
                let candidate = match m.split {
                    None => (i, m.active_version, Via::Direct),
                    // A split whose arm did not resolve leaves its model out; without
                    // cross-model arms an arm is a version of this model.
                    Some(_) => match resolve_named(self.policy, i, &self.sticky) {
                        Some(arm) if arm.0 == i => arm,
                        _ => continue,
                    },
                };
                let (Some(&quality), Some(&cost)) = (pass.quality.get(j), pass.cost.get(j)) else {
                    continue;
                };
                if let Some(utility) = live_utility(ctx, i, candidate.1, m, quality, cost, engine) {
                    consider(utility, candidate);
                }
            }
        }
    }

    /// [`Plan::best_primary`] keeping a full score per candidate as it scans.
    fn best_primary_scored(
        &self,
        ctx: &Context,
        engine: &dyn EngineView,
    ) -> (Option<Scored>, usize) {
        let mut best: Option<Scored> = None;
        let mut qualifying = 0;
        for (m, v, via) in self.candidates() {
            let Some(s) = score(ctx, m, v, via, engine, Detail::Verdict) else {
                continue;
            };
            qualifying += 1;
            if best
                .as_ref()
                .is_none_or(|b| pick_order(self.policy, &s, b).is_lt())
            {
                best = Some(s);
            }
        }
        (best, qualifying)
    }

    /// Scores the requested model's fallbacks when its own candidate broke a constraint
    /// the fallback list is meant for; `None` when no fallback applies.
    pub fn score_fallbacks(
        &self,
        ctx: &Context,
        primary: &[Scored],
        engine: &dyn EngineView,
    ) -> Option<Vec<Scored>> {
        let model = self.policy.compiled.models.get(self.requested?)?;
        let fallback = model.fallback.as_ref()?;
        let triggered = primary
            .iter()
            .flat_map(|s| &s.failures)
            .any(|f| match f.trigger() {
                Some(Trigger::Overloaded) => fallback.on.overloaded,
                Some(Trigger::Failing) => fallback.on.failing,
                Some(Trigger::OverBudget) => fallback.on.over_budget,
                None => false,
            });
        triggered.then(|| self.score_all_fallbacks(ctx, engine))
    }

    /// Scores every fallback alternative of the requested model (explain shows them all).
    pub fn score_all_fallbacks(&self, ctx: &Context, engine: &dyn EngineView) -> Vec<Scored> {
        let Some(fallback) = self
            .requested
            .and_then(|i| self.policy.compiled.models.get(i)?.fallback.as_ref())
        else {
            return Vec::new();
        };
        fallback
            .alternatives
            .iter()
            .enumerate()
            .filter_map(|(rank, t)| {
                let m = self.policy.compiled.models.get(t.model)?;
                let v = t.version.unwrap_or(m.active_version);
                score(ctx, t.model, v, Via::Fallback { rank }, engine, Detail::All)
            })
            .collect()
    }

    pub fn hint_text(&self) -> String {
        self.hint.to_string()
    }

    pub fn reason(&self) -> RouteReason {
        self.reason
    }
}

/// What sticky splits hash for this request.
struct StickyKey<'a> {
    req: &'a RouteRequest,
    tenant: Option<TenantRef<'a>>,
}

impl StickyKey<'_> {
    fn for_split(&self, sticky: Sticky) -> Cow<'_, str> {
        let key = match &self.req.caller {
            Caller::ApiKey(k) => Some(k.as_str()),
            _ => None,
        };
        let tenant = self.tenant.map(|t| &*t.compiled.name);
        let chosen = match sticky {
            Sticky::User => self.req.user.as_deref().or(key).or(tenant),
            Sticky::Key => key.or(tenant),
            Sticky::None => None,
        };
        chosen.map_or_else(
            || Cow::Owned(self.req.request_id.to_string()),
            Cow::Borrowed,
        )
    }
}

/// The checkpoint every model stands for (under `auto`), in model order, each once.
fn every_model(policy: &Policy, sticky: &StickyKey) -> Candidates {
    if !policy.compiled.cross_model_arms {
        // Each model's checkpoints are its own: no two models can stand for the same one.
        return Candidates::EveryModel;
    }
    let mut c: Vec<Candidate> = Vec::with_capacity(policy.compiled.models.len());
    // A cross-model split arm may repeat another model's checkpoint.
    let mut seen = vec![false; policy.compiled.checkpoint_count];
    for i in 0..policy.compiled.models.len() {
        if let Some(t) = resolve_named(policy, i, sticky) {
            let slot = policy.compiled.checkpoint_base.get(t.0).map(|b| b + t.1);
            if let Some(seen) = slot.and_then(|s| seen.get_mut(s)) {
                if !*seen {
                    *seen = true;
                    c.push(t);
                }
            }
        }
    }
    Candidates::Listed(c)
}

/// The checkpoint a model name stands for: its split's arm, else its active version.
fn resolve_named(policy: &Policy, model: usize, sticky: &StickyKey) -> Option<(usize, usize, Via)> {
    let m = policy.compiled.models.get(model)?;
    let Some(split_index) = m.split else {
        return Some((model, m.active_version, Via::Direct));
    };
    let split = policy.compiled.splits.get(split_index)?;
    // A tripped rollback rule pins every request to the split's baseline arm.
    let arm_index = match policy.live.rollback(split_index) {
        Some(monitor) if monitor.is_rolled_back() => monitor.rule().baseline,
        _ => split.assign(&sticky.for_split(split.sticky)),
    };
    let arm = split.arms.get(arm_index)?;
    Some((
        arm.model,
        arm.version,
        Via::Split {
            split: split_index,
            arm: arm_index,
        },
    ))
}

fn model_named(policy: &Policy, name: &str) -> Result<usize, RouteError> {
    policy.model_index(name).ok_or_else(|| {
        let mut known: Vec<&str> = policy.compiled.models.iter().map(|m| &*m.name).collect();
        known.sort_unstable();
        RouteError::UnknownModel {
            name: name.to_string(),
            known: known.join(", "),
        }
    })
}
