//! Cascades (`[cascade]` in the policy): an `auto` request is answered by the cascade's
//! first model; when the engine's confidence in that answer (a quantile of its token
//! log-probabilities, or its first token's margin, measured in the engine) is below the
//! threshold, the answer is dropped and the next model answers instead.
//!
//! With a first-token statistic (`margin`, `neg_entropy`) the verdict is known after one
//! token: the step is submitted with the cascade's unsure stop ([`UnsureStop`]), so the
//! engine ends a generation it would defer after that token (early escalation: the
//! deferred attempt costs its prompt and one token), and a stream waits for the first
//! token only. Otherwise a streamed request waits for the whole first answer: a step
//! before the last runs to its end unseen, and the stream (headers included, so
//! `x-switchyard-cascade` is known) starts once it is judged (`judged_stream` in
//! `openai/tail/stream.rs`). Under `min_margin` the step carries an every-token stop:
//! the engine ends the answer at its first token whose margin is below the threshold
//! (the answer's smallest margin then is), so a deferred long answer costs its prompt
//! and the tokens up to that one, not its whole length. With `handoff = true` the next
//! model does not start over: it continues the attempt's tokens before the unsure one
//! (`openai/tail/handoff.rs`; `x-switchyard-handoff` says how many were kept). The deferred attempt is billed
//! like any answer (its tokens were computed); the response's `usage` is the answer the
//! client gets.

use switchyard_policies::{ModelHint, RouteRequest, Verdict};
use switchyard_seam::{TokenConfidence, TokenMargin, UnsureStop, Usage};

use crate::policy::routed::{label, RouteSummary, RoutedRequest};
use crate::policy::routing::PolicyRouting;

/// Counter: cascade verdicts by `model` (the checkpoint judged) and `outcome`
/// (`accepted`, `deferred`).
pub const CASCADE_TOTAL: &str = "switchyard_cascade_total";

/// Counter: deferred attempts the engine stopped early, at their first token or (under
/// `min_margin`) their first unsure one, by `model`.
pub const CASCADE_STOPPED_EARLY_TOTAL: &str = "switchyard_cascade_stopped_early_total";

/// Counter: deferred answers handed off (the next model continued their sure part), by
/// `from` and `to` (checkpoints).
pub const CASCADE_HANDOFF_TOTAL: &str = "switchyard_cascade_handoff_total";

/// Counter: tokens of handed-off answers kept in the response (the first model's sure
/// tokens, every choice's), by `model` (the checkpoint that wrote them).
pub const CASCADE_KEPT_TOKENS_TOTAL: &str = "switchyard_cascade_kept_tokens_total";

/// When the current policy has a cascade and `request` is `auto`: the request as its
/// first step routes it (the cascade's first model, named).
pub(crate) fn first_step(routing: &PolicyRouting, request: &RouteRequest) -> Option<RouteRequest> {
    if request.model != ModelHint::Auto {
        return None;
    }
    let policy = routing.store().current();
    let first = policy.cascade()?.models.first().copied()?;
    let model = policy.models().get(first)?;
    let mut step = request.clone();
    step.model = ModelHint::Named {
        name: model.name.to_string(),
    };
    Some(step)
}

/// What a cascade step's answer is judged by.
#[derive(Debug, Clone, Copy)]
pub enum Evidence {
    /// The whole answer's confidence (the least confident choice's).
    Answer(Option<TokenConfidence>),
    /// The first token's margin (the least decided choice's), with a first-token
    /// statistic.
    FirstToken(Option<TokenMargin>),
}

impl RoutedRequest {
    /// Marks a request routed by [`first_step`]: its explanation.
    pub(crate) fn start_cascade(&self) {
        let Some(ticket) = self.ticket() else { return };
        let mut state = ticket.lock();
        let summary = &mut state.summary;
        summary.explanation = format!(
            "cascade step 1 (auto with [cascade]): {}",
            summary.explanation
        );
    }

    /// Whether the answer this request is routed to now will be judged: an `auto`
    /// request on a cascade step before the last, not judged already.
    pub fn judged_in_cascade(&self) -> bool {
        self.step_judged().is_some()
    }

    /// The unsure stop the answer this request is routed to now is submitted with: a
    /// judged step under a first-token statistic.
    pub fn unsure_stop(&self) -> Option<UnsureStop> {
        self.step_judged()?.unsure_stop()
    }

    /// Whether the answer this request is routed to now is judged on its first token
    /// alone (a judged step under a first-token statistic).
    pub fn judged_on_first_token(&self) -> bool {
        self.step_judged()
            .is_some_and(|cascade| cascade.judged_on_first_token())
    }

    /// Whether a deferral of the current step is handed off ([`Cascade::hands_off`]).
    ///
    /// [`Cascade::hands_off`]: switchyard_policies::Cascade::hands_off
    pub fn hands_off_in_cascade(&self) -> bool {
        self.step_judged()
            .is_some_and(|cascade| cascade.hands_off())
    }

    /// The cascade judging the current step, if it is judged.
    fn step_judged(&self) -> Option<switchyard_policies::Cascade> {
        let ticket = self.ticket()?;
        if ticket.request.model != ModelHint::Auto {
            return None;
        }
        let policy = ticket.routing.store().current();
        let cascade = policy.cascade()?;
        let state = ticket.lock();
        if state.cascade_settled {
            return None;
        }
        policy
            .model_index(&state.summary.model)
            .and_then(|current| cascade.next_after(current))
            .map(|_| cascade.clone())
    }

    /// Judges the current step's answer by `evidence` when the step is judged. Accepted:
    /// records the verdict and returns `None`. Deferred: the verdict, for
    /// [`RoutedRequest::defer_in_cascade`] once the attempt's usage is known. `None` as
    /// well when the step is not judged.
    pub fn judge_in_cascade(&self, evidence: Evidence) -> Option<Verdict> {
        let cascade = self.step_judged()?;
        let verdict = match evidence {
            Evidence::Answer(confidence) => cascade.judge(confidence.as_ref()),
            Evidence::FirstToken(margin) => cascade.judge_first(margin.as_ref()),
        };
        if verdict.defer {
            return Some(verdict);
        }
        if let Some(ticket) = self.ticket() {
            let mut state = ticket.lock();
            state.summary.cascade = Some(format!("accepted: {}", verdict.reason));
            count(&state.summary, "accepted");
        }
        None
    }

    /// Ends the cascade's judging of the current step: its answer stands as it will
    /// come, asked without the unsure stop.
    pub fn settle_cascade(&self) {
        if let Some(ticket) = self.ticket() {
            ticket.lock().cascade_settled = true;
        }
    }

    /// Defers the attempt judged by `verdict`, which used `usage` (billed to it) and
    /// which the engine may have `stopped_early` (at its first or first unsure token):
    /// routes to the next model and returns true (the caller submits again). `kept`: the
    /// tokens each choice hands off to the next model (`openai/tail/handoff.rs`), for the headers
    /// and metrics; `None` when the next model answers from scratch. When the next model
    /// cannot take the request (budget, permission), the attempt's answer stands and
    /// false is returned; an attempt the engine stopped early must then be asked again,
    /// without the stop ([`RoutedRequest::unsure_stop`] is `None` from then on).
    pub fn defer_in_cascade(
        &self,
        verdict: Verdict,
        usage: Usage,
        stopped_early: bool,
        kept: Option<&[usize]>,
    ) -> bool {
        let Some(ticket) = self.ticket() else {
            return false;
        };
        let policy = ticket.routing.store().current();
        let (model, from) = {
            let state = ticket.lock();
            (
                state.summary.model.clone(),
                state.summary.checkpoint().to_string(),
            )
        };
        let first_token = policy
            .cascade()
            .is_some_and(switchyard_policies::Cascade::judged_on_first_token);
        let next = policy.cascade().and_then(|cascade| {
            let current = policy.model_index(&model)?;
            cascade.next_after(current)
        });
        let Some(next_model) = next.and_then(|next| policy.models().get(next)) else {
            return false;
        };
        let mut request = ticket.request.clone();
        request.model = ModelHint::Named {
            name: next_model.name.to_string(),
        };
        let Ok(mut route) = ticket.routing.route(&request) else {
            // The stronger model cannot take it (budget, permission): the answer stands.
            let mut state = ticket.lock();
            state.cascade_settled = true;
            state.summary.cascade = Some(format!(
                "accepted: {}; `{}` cannot take the request",
                verdict.reason, next_model.name
            ));
            count(&state.summary, "accepted");
            return false;
        };
        label(&mut route, &ticket.request, &ticket.request_id);
        {
            let state = ticket.lock();
            count(&state.summary, "deferred");
            if stopped_early {
                ::metrics::counter!(CASCADE_STOPPED_EARLY_TOTAL, "model" => state.summary.checkpoint().to_string())
                    .increment(1);
            }
        }
        self.succeeded(usage);
        let mut state = ticket.lock();
        route.explanation = format!(
            "cascade: {from} deferred ({}); {}",
            verdict.reason, route.explanation
        );
        state.summary = RouteSummary::of(&mut route);
        // What the attempt cost, so a client can price the cascade it used.
        let spent = format!(
            "{} prompt + {} generated tokens",
            usage.prompt_tokens, usage.completion_tokens
        );
        let how = match (stopped_early, first_token) {
            (true, true) => format!("stopped after its first token ({spent})"),
            (true, false) => format!("stopped at its first unsure token ({spent})"),
            (false, _) => format!("ran to its end ({spent})"),
        };
        let handed = kept.map(|kept| {
            let to = state.summary.checkpoint().to_string();
            let counts: Vec<String> = kept.iter().map(usize::to_string).collect();
            ::metrics::counter!(CASCADE_HANDOFF_TOTAL, "from" => from.clone(), "to" => to.clone())
                .increment(1);
            let total = kept.iter().sum::<usize>();
            ::metrics::counter!(CASCADE_KEPT_TOKENS_TOTAL, "model" => from.clone())
                .increment(u64::try_from(total).unwrap_or(u64::MAX));
            (counts.join(","), to)
        });
        let handoff = handed.as_ref().map_or(String::new(), |(counts, to)| {
            format!("; handed off: {to} continues its first {counts} tokens")
        });
        state.summary.cascade = Some(format!(
            "deferred from {from}: {}; the attempt {how}{handoff}",
            verdict.reason
        ));
        state.summary.handoff =
            handed.map(|(counts, to)| format!("from={from} kept={counts} to={to}"));
        state.route = Some(route);
        tracing::info!(%from, to = %state.summary.checkpoint().to_string(), reason = %verdict.reason, stopped_early, "cascade deferred");
        true
    }
}

fn count(summary: &RouteSummary, outcome: &'static str) {
    ::metrics::counter!(CASCADE_TOTAL, "model" => summary.checkpoint().to_string(), "outcome" => outcome)
        .increment(1);
}
