//! Fair admission: which waiting request of a checkpoint takes the next batch slot.
//!
//! First come, first served lets a tenant with 48 streams queued ahead keep a light
//! tenant waiting behind all of them. Instead, the next slot goes to the tenant with
//! the fewest running sequences per unit of its policy weight (`TenantShare`), its
//! oldest waiting request first; ties go to the request that came first. A tenant
//! alone in the queue is served in order, as before. Requests without a tenant count
//! as one tenant of weight 1.
//!
//! The same rule shapes a step ([`step_for`]): while a tenant below its share (the
//! fewest running sequences per weight, strictly fewer than another tenant's) has a
//! prompt to run, the step runs that tenant's sequences only, so its prompt is not
//! computed beside every other tenant's decode rows and prompts. A light tenant's
//! time to first token then stays near what it is alone; a heavy tenant loses one
//! step per light prompt.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use switchyard_seam::TenantShare;

use super::queue::Waiting;

/// The position in `waiting` to admit when the scheduler asks for `at`: the oldest
/// request of the tenant with the fewest running sequences per weight (`running`:
/// one tenant per running sequence), when that is strictly fewer than `at`'s
/// tenant's; else `at`. Only requests `may_run` (within their tenant's KV part:
/// `tenant_cap.rs`) are candidates; when `at` may not run, the best candidate
/// takes its place (`at` when there is none).
pub(super) fn next_at<'a>(
    waiting: &VecDeque<Waiting>,
    at: usize,
    running: impl Iterator<Item = &'a Option<Arc<str>>>,
    may_run: impl Fn(&Waiting) -> bool,
) -> usize {
    let Some(asked) = waiting.get(at) else {
        return at;
    };
    let running: Vec<&Option<Arc<str>>> = running.collect();
    let candidates: Vec<(usize, &TenantShare)> = (waiting.iter().enumerate())
        .filter(|(_, w)| may_run(w))
        .map(|(i, w)| (i, &w.request.share))
        .collect();
    let Some(best) = pick(candidates.iter().map(|(_, s)| *s), running.iter().copied())
        .and_then(|i| candidates.get(i))
        .map(|&(i, _)| i)
    else {
        return at;
    };
    if !may_run(asked) {
        return best;
    }
    // `asked` wins a tie: only a tenant strictly below it takes its place.
    let asked = &asked.request.share;
    let ahead = std::iter::once(asked).chain(waiting.get(best).map(|w| &w.request.share));
    match pick(ahead, running.iter().copied()) {
        Some(1) => best,
        _ => at,
    }
}

/// The index of the waiting request (by its tenant's share, oldest first) that takes
/// the next slot.
fn pick<'w, 'r>(
    waiting: impl Iterator<Item = &'w TenantShare>,
    running: impl Iterator<Item = &'r Option<Arc<str>>>,
) -> Option<usize> {
    let mut counts: HashMap<&Option<Arc<str>>, u64> = HashMap::new();
    for tenant in running {
        *counts.entry(tenant).or_default() += 1;
    }
    // Fewest running per weight, compared as running_a * weight_b < running_b *
    // weight_a; strictly fewer, so the oldest request wins a tie.
    let mut best: Option<(usize, u64, u64)> = None;
    for (i, share) in waiting.enumerate() {
        let running = counts.get(&share.tenant).copied().unwrap_or(0);
        let weight = u64::from(share.weight.max(1));
        let better = best.is_none_or(|(_, r, w)| running * w < r * weight);
        if better {
            best = Some((i, running, weight));
        }
    }
    best.map(|(i, _, _)| i)
}

/// Which running sequences the next step runs, given each one's share and whether it
/// is decoding: `None` for all of them (the usual step), or a mask of the sequences
/// of the tenants below their share when one of those has a prompt to run.
pub(super) fn step_for<'a>(
    sequences: impl Iterator<Item = (&'a TenantShare, bool)>,
) -> Option<Vec<bool>> {
    let sequences: Vec<(&TenantShare, bool)> = sequences.collect();
    let mut counts: HashMap<&Option<Arc<str>>, (u64, u64)> = HashMap::new();
    for (share, _) in &sequences {
        let entry = counts
            .entry(&share.tenant)
            .or_insert((0, u64::from(share.weight.max(1))));
        entry.0 += 1;
    }
    // Running per weight as fractions (count, weight): a < b when a.0 * b.1 < b.0 * a.1.
    let less = |a: (u64, u64), b: (u64, u64)| a.0 * b.1 < b.0 * a.1;
    let lowest = counts
        .values()
        .copied()
        .reduce(|a, b| if less(b, a) { b } else { a })?;
    if !counts.values().any(|&c| less(lowest, c)) {
        return None;
    }
    let mask: Vec<bool> = sequences
        .iter()
        .map(|(share, _)| counts.get(&share.tenant).is_some_and(|&c| !less(lowest, c)))
        .collect();
    let prompt_waiting = sequences
        .iter()
        .zip(&mask)
        .any(|((_, decoding), &below)| below && !decoding);
    prompt_waiting.then_some(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> Option<Arc<str>> {
        Some(Arc::from(name))
    }

    #[test]
    fn the_tenant_with_fewest_running_per_weight_goes_next_oldest_first() {
        let heavy = TenantShare::new("heavy", 1);
        let light = TenantShare::new("light", 1);
        let queue = [heavy.clone(), heavy.clone(), light.clone(), light.clone()];
        let running = [tenant("heavy"), tenant("heavy")];
        assert_eq!(pick(queue.iter(), running.iter()), Some(2));
        // Alone, or level: first come, first served.
        assert_eq!(pick(queue[..2].iter(), running.iter()), Some(0));
        assert_eq!(pick(queue.iter(), [].iter()), Some(0));
        // Weight 4 against 1: four running heavy to one light are level.
        let weighted = TenantShare::new("heavy", 4);
        let running = [
            tenant("heavy"),
            tenant("heavy"),
            tenant("heavy"),
            tenant("heavy"),
            tenant("light"),
        ];
        let queue = [weighted.clone(), light.clone()];
        assert_eq!(pick(queue.iter(), running.iter()), Some(0));
        // Requests without a tenant are one tenant among the others.
        let queue = [TenantShare::default(), light.clone()];
        assert_eq!(pick(queue.iter(), [None, None].iter()), Some(1));
    }

    #[test]
    fn a_tenant_below_its_share_with_a_prompt_to_run_gets_the_step() {
        let heavy = TenantShare::new("heavy", 1);
        let light = TenantShare::new("light", 1);
        // Three heavy decoding, one light prefilling: the light one alone.
        let step = [
            (&heavy, true),
            (&heavy, true),
            (&light, false),
            (&heavy, true),
        ];
        assert_eq!(
            step_for(step.into_iter()),
            Some(vec![false, false, true, false])
        );
        // Decoding, it leaves the step to everyone; so do level tenants.
        let step = [(&heavy, true), (&heavy, false), (&light, true)];
        assert_eq!(step_for(step.into_iter()), None);
        let step = [(&heavy, false), (&light, false)];
        assert_eq!(step_for(step.into_iter()), None);
        // Weight 3 to 1: three heavy to one light is level.
        let weighted = TenantShare::new("heavy", 3);
        let step = [
            (&weighted, true),
            (&weighted, true),
            (&weighted, true),
            (&light, false),
        ];
        assert_eq!(step_for(step.into_iter()), None);
    }
}
