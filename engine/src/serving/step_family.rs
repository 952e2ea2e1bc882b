//! Which group leads the next step, when some share their steps.
//!
//! Groups whose checkpoints share steps (a base and its LoRA adapters: one
//! set of base weights, each adapter's update on its own rows) run together
//! whichever of them leads, so they compete as one family
//! ([`choice::family`]); the family chosen is led by its member that asks
//! most, so that a member left out of a full step leads a later one.

use std::time::Instant;

use switchyard_kernels::Backend;

use super::choice::{self, Claim};
use super::group::Group;

/// The index of the group that leads the next step, among `runnable`
/// (indices into `groups` and `claims`).
pub(super) fn choose_lead<B: Backend>(
    groups: &[Group<B>],
    claims: &[Claim],
    runnable: &[usize],
    now: Instant,
) -> Option<usize> {
    let claims_of = |members: &[usize]| -> Vec<Claim> {
        (members.iter())
            .filter_map(|&i| claims.get(i).copied())
            .collect()
    };
    let families = families(groups, runnable);
    let family_claims: Vec<Claim> = (families.iter())
        .filter_map(|members| choice::family(&claims_of(members)))
        .collect();
    let family = families.get(choice::choose(&family_claims, now)?)?;
    family
        .get(choice::choose(&claims_of(family), now)?)
        .copied()
}

/// `runnable` split into sets of groups whose checkpoints share steps with
/// the set's first (`shares_steps_with`, as the step plan asks), in
/// `runnable`'s order.
fn families<B: Backend>(groups: &[Group<B>], runnable: &[usize]) -> Vec<Vec<usize>> {
    let mut families: Vec<Vec<usize>> = Vec::new();
    for &index in runnable {
        let Some(group) = groups.get(index) else {
            continue;
        };
        let home = families.iter_mut().find(|family| {
            (family.first())
                .and_then(|&first| groups.get(first))
                .is_some_and(|first| {
                    (first.checkpoint.model).shares_steps_with(&group.checkpoint.model)
                })
        });
        match home {
            Some(family) => family.push(index),
            None => families.push(vec![index]),
        }
    }
    families
}
