//! The `auto` scan: the policy-and-request constraints of every model, checked a block of
//! models at a time over the compiled policy's columns.
//!
//! Under `auto` every model is a candidate. The constraints that need only the policy
//! and the request (permission, quality floor, cost ceiling, budgets, context length)
//! are the same few operations on every model, so they run as one tight pass over
//! columns of numbers ([`crate::compiled::scan_table::ScanTable`]: no calls, no branches
//! per model); only the models that pass read live engine state.
//! [`crate::score::qualifying_utility`] makes the same checks one model at a time;
//! `static_pass_matches_the_fast_verdict` holds the two equal.

use crate::context::Context;

/// Models per [`StaticPass`]: one bit each in a `u64`.
pub(crate) const BLOCK: usize = 64;

/// The policy-and-request verdicts of one block of models, and the numbers the rest of
/// the scoring needs from them.
pub(crate) struct StaticPass {
    /// Bit `j`: model `start + j` breaks none of these constraints.
    pub passed: u64,
    /// Quality for the request's tags, by `j`.
    pub quality: [f64; BLOCK],
    /// Estimated cost of the request, by `j`.
    pub cost: [f64; BLOCK],
}

/// The verdicts of models `start..start + BLOCK` (fewer in the last block; none
/// past the end).
// Out of line: inlined into the scan loop of `Plan::best_primary` it made that loop
// slower (callgrind: about 1,700 more instructions per routed request).
#[inline(never)]
pub(crate) fn pass(ctx: &Context, start: usize) -> StaticPass {
    let table = &ctx.policy.compiled.scan;
    let mut out = StaticPass {
        passed: 0,
        quality: [0.0; BLOCK],
        cost: [0.0; BLOCK],
    };
    let end = (start + BLOCK).min(table.quality.len());
    let (Some(cost_in), Some(cost_out), Some(overall), Some(context_limit)) = (
        table.cost_per_1k_input.get(start..end),
        table.cost_per_1k_output.get(start..end),
        table.quality.get(start..end),
        table.context_limit.get(start..end),
    ) else {
        return out;
    };
    let scan = &ctx.scan;
    if !scan.tokens_fit {
        // The request's tokens are the same on every model: none fits the budget.
        return out;
    }
    let n = overall.len();
    let (quality, cost) = (&mut out.quality[..n], &mut out.cost[..n]);
    if ctx.tag_ids.is_empty() {
        quality.copy_from_slice(overall);
    } else {
        for (j, (q, &overall)) in quality.iter_mut().zip(overall).enumerate() {
            *q = ctx
                .policy
                .compiled
                .tags
                .quality(start + j, overall, &ctx.tag_ids)
                .0;
        }
    }
    let (per_1k_in, per_1k_out) = ctx.thousands;
    let (room, needed) = (ctx.budget_room.cost, ctx.context_needed);
    let mut passed = 0u64;
    let columns = cost_in.iter().zip(cost_out).zip(context_limit);
    let outputs = cost.iter_mut().zip(quality.iter());
    for (j, (((&per_1k_input, &per_1k_output), &limit), (c, &q))) in
        columns.zip(outputs).enumerate()
    {
        // The same operations in the same order as `Context::estimate`: same bits.
        *c = per_1k_in * per_1k_input + per_1k_out * per_1k_output;
        // The comparisons `static_verdict` makes (NaN fails none of them).
        let fails =
            (q < scan.quality_floor) | (*c > scan.cost_ceiling) | (*c > room) | (needed > limit);
        passed |= u64::from(!fails) << j;
    }
    if let Some(allowed) = scan.allowed {
        for j in 0..n {
            if !allowed.get(start + j).copied().unwrap_or(false) {
                passed &= !(1u64 << j);
            }
        }
    }
    // Budgets hold the worst case, which depends on each model's context window.
    for j in 0..n {
        let worst_fits = ctx
            .policy
            .compiled
            .models
            .get(start + j)
            .is_none_or(|m| ctx.worst_case_fits(m));
        if passed >> j & 1 == 1 && !worst_fits {
            passed &= !(1u64 << j);
        }
    }
    out.passed = passed;
    out
}
