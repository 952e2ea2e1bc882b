//! What every candidate of one request is measured against: the request's hints with
//! the tenant's defaults, its token and cost estimates, and the tenant's budget room,
//! worked out once per request so that scoring a candidate only reads them.

use crate::authenticate::TenantRef;
use crate::compiled::model::Model;
use crate::live::budget::now_secs;
use crate::policy::Policy;
use crate::request::{Hints, RouteRequest};
use crate::spend::{BudgetUnit, Price, Spend};

/// What every candidate of one request is measured against.
pub(crate) struct Context<'a> {
    pub policy: &'a Policy,
    pub tenant: Option<TenantRef<'a>>,
    pub min_quality: Option<f64>,
    pub max_cost: Option<f64>,
    pub max_latency_ms: Option<f64>,
    pub tags: &'a [String],
    /// Each of `tags` as an id of the policy's tag table (`None`: no model scores it).
    pub tag_ids: Vec<Option<usize>>,
    pub prompt_tokens: u64,
    /// `max_tokens`, or the assumed output length, for cost and latency estimates.
    pub output_tokens: u64,
    /// Prompt plus `max_tokens` (0 when unset), for the context limit.
    pub context_needed: u64,
    /// `max_tokens` as the request set it, for the worst case a budget holds.
    pub max_output_tokens: Option<u64>,
    /// Generations the request fans out into (prompts × `n`), at least 1.
    pub generations: u64,
    /// Remaining amount per tenant budget, read once per request.
    pub budget_remaining: Vec<f64>,
    /// The least remaining over the tenant's budgets of each unit: a candidate fits
    /// every budget exactly when it fits these (infinite where no budget applies).
    pub budget_room: BudgetRoom,
    /// Prompt and output tokens in thousands, as prices are quoted.
    pub thousands: (f64, f64),
    /// The request's constants as the `auto` scan reads them.
    pub scan: ScanBounds<'a>,
}

/// The limits of one request that do not depend on the candidate, in the form the
/// fast verdict ([`crate::score::qualifying_utility`]) and the `auto` scan compare
/// against.
pub(crate) struct ScanBounds<'a> {
    /// The tenant's model permissions (`None`: every model).
    pub allowed: Option<&'a [bool]>,
    /// The quality floor, or -inf.
    pub quality_floor: f64,
    /// The cost ceiling, or +inf.
    pub cost_ceiling: f64,
    /// Whether the request's tokens fit every token budget (they are the same on every
    /// model).
    pub tokens_fit: bool,
}

impl<'a> Context<'a> {
    /// Request hints win; the tenant's defaults fill what the request leaves unset.
    pub fn new(policy: &'a Policy, tenant: Option<TenantRef<'a>>, req: &'a RouteRequest) -> Self {
        let defaults = tenant.map(|t| &t.compiled.default_hints);
        let pick = |own: Option<f64>, default: fn(&Hints) -> Option<f64>| {
            own.or_else(|| defaults.and_then(default))
        };
        let tags: &[String] = if req.hints.tags.is_empty() {
            defaults.map_or(&[], |d| &d.tags[..])
        } else {
            &req.hints.tags
        };
        let now = now_secs();
        let budgets = tenant.map_or(&[][..], |t| &t.live.budgets[..]);
        let budget_remaining: Vec<f64> = budgets.iter().map(|b| b.remaining_at(now)).collect();
        let mut budget_room = BudgetRoom {
            tokens: f64::INFINITY,
            cost: f64::INFINITY,
        };
        for (budget, &remaining) in budgets.iter().zip(&budget_remaining) {
            let room = match budget.unit() {
                BudgetUnit::Tokens => &mut budget_room.tokens,
                BudgetUnit::Cost => &mut budget_room.cost,
            };
            *room = room.min(remaining);
        }
        let output_tokens = u64::from(
            req.max_output_tokens
                .unwrap_or(policy.compiled.routing.assumed_output_tokens),
        );
        let min_quality = pick(req.hints.min_quality, |d| d.min_quality);
        let max_cost = pick(req.hints.max_cost, |d| d.max_cost);
        let tokens = u64::from(req.prompt_tokens) + output_tokens;
        let scan = ScanBounds {
            allowed: tenant.and_then(|t| t.compiled.allowed.as_deref()),
            quality_floor: min_quality.unwrap_or(f64::NEG_INFINITY),
            cost_ceiling: max_cost.unwrap_or(f64::INFINITY),
            tokens_fit: tokens as f64 <= budget_room.tokens,
        };
        Context {
            policy,
            tenant,
            min_quality,
            max_cost,
            max_latency_ms: pick(req.hints.max_latency_ms, |d| d.max_latency_ms),
            tags,
            tag_ids: tags.iter().map(|t| policy.compiled.tags.id(t)).collect(),
            prompt_tokens: u64::from(req.prompt_tokens),
            output_tokens,
            context_needed: u64::from(req.prompt_tokens)
                + u64::from(req.max_output_tokens.unwrap_or(0)),
            max_output_tokens: req.max_output_tokens.map(u64::from),
            generations: u64::from(req.generations.max(1)),
            budget_remaining,
            budget_room,
            thousands: (
                u64::from(req.prompt_tokens) as f64 / 1000.0,
                output_tokens as f64 / 1000.0,
            ),
            scan,
        }
    }

    /// The quality of `model` for the request's tags, and the index of the tag that set it.
    pub fn quality(&self, model: usize, m: &Model) -> (f64, Option<usize>) {
        self.policy
            .compiled
            .tags
            .quality(model, m.quality, &self.tag_ids)
    }

    /// This request's estimated tokens and cost on `m`: [`Price::spend`] with the
    /// per-request divisions done once, in [`Context::new`] (the same operations in the
    /// same order, so the same bits; `estimate_is_price_spend` checks it).
    pub fn estimate(&self, m: &Model) -> Spend {
        Spend {
            tokens: self.prompt_tokens + self.output_tokens,
            cost: self.thousands.0 * m.cost_per_1k_input + self.thousands.1 * m.cost_per_1k_output,
        }
    }

    /// The most this request can spend on `m`, which its budget reservation holds and
    /// its budgets must fit: every generation (prompts × `n`) running to its
    /// `max_tokens`, or to the end of the model's context window when it sets none (the
    /// engine generates up to there), each generation's prompt and output together never
    /// past that window.
    pub fn worst_case(&self, m: &Model) -> Spend {
        let context = u64::from(m.context_limit);
        let prompt = self.prompt_tokens.min(context);
        let output = match self.max_output_tokens {
            Some(max) => max.min(context - prompt),
            None => context - prompt,
        };
        m.price().spend(
            prompt.saturating_mul(self.generations),
            output.saturating_mul(self.generations),
        )
    }

    /// Whether [`Context::worst_case`] on `m` fits every budget of the tenant (most
    /// tenants have none: then it is one comparison).
    pub fn worst_case_fits(&self, m: &Model) -> bool {
        let room = self.budget_room;
        if !room.tokens.is_finite() && !room.cost.is_finite() {
            return true;
        }
        let worst = self.worst_case(m);
        worst.tokens as f64 <= room.tokens && worst.cost <= room.cost
    }

    /// [`Context::worst_case`] of model index `model`.
    pub fn worst_case_of(&self, model: usize) -> Spend {
        self.policy
            .compiled
            .models
            .get(model)
            .map_or(Spend::default(), |m| self.worst_case(m))
    }

    /// The price of a model, for estimates and settling.
    pub fn price(&self, model: usize) -> Price {
        self.policy
            .compiled
            .models
            .get(model)
            .map_or(Price::default(), Model::price)
    }
}

/// The least remaining amount of each budget unit (see [`Context::budget_room`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BudgetRoom {
    pub tokens: f64,
    pub cost: f64,
}
