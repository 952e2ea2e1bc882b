//! The executor's side of the backend's residency tiers: a checkpoint runs
//! only once its matrices are where the backend's kernels read them, and
//! the one the queue needs next is copied up while the current batch runs.
//!
//! Each step, every checkpoint with work is asked for its tier
//! ([`Backend::weight_tier`]; always resident on the CPU). One that is not
//! resident (the registry demoted it to the host tier, or its copy up is
//! in flight) sits the step out rather than stalling it. Of those, the one
//! whose claim is strongest, the next batch it would lead, gets
//! [`Backend::prefetch`] before the step runs: the copy goes on the
//! backend's copy stream beside the step's kernels, and a later step finds
//! it resident. What was seen is recorded on the checkpoint
//! ([`super::ServedCheckpoint::placement`]) for status and routing.

use std::time::Instant;

use switchyard_kernels::{Backend, WeightTier};

use super::choice::{self, Claim};
use super::group::Group;

/// Whether each group's checkpoint can run now (see the module
/// documentation).
pub(super) fn resident<B: Backend>(backend: &B, groups: &[Group<B>]) -> Vec<bool> {
    groups
        .iter()
        .map(|g| {
            let tier = backend.weight_tier(&g.checkpoint.model.weight_matrices());
            g.checkpoint.set_placement(tier);
            tier == WeightTier::Resident
        })
        .collect()
}

/// Starts the copy up of the checkpoint, of those with work that cannot
/// run yet, whose claim is strongest; `Err` names it and why the backend
/// refused (its requests cannot run).
pub(super) fn next<B: Backend>(
    backend: &B,
    groups: &[Group<B>],
    claims: &[Claim],
    resident: &[bool],
    now: Instant,
) -> Result<(), (usize, String)> {
    let waiting = groups
        .iter()
        .zip(claims)
        .zip(resident)
        .enumerate()
        .filter(|(_, ((g, c), on_device))| {
            c.rows > 0 && !**on_device && g.checkpoint.placement() == WeightTier::Host
        })
        .max_by(|(_, ((_, a), _)), (_, ((_, b), _))| {
            choice::score(a, now).total_cmp(&choice::score(b, now))
        })
        .map(|(i, ((g, _), _))| (i, g));
    let Some((index, group)) = waiting else {
        return Ok(());
    };
    let checkpoint = &group.checkpoint;
    match backend.prefetch(&checkpoint.model.weight_matrices()) {
        Ok(tier) => {
            checkpoint.set_placement(tier);
            Ok(())
        }
        Err(e) => Err((
            index,
            format!(
                "{} could not be copied to the device to run: {e}",
                checkpoint.id
            ),
        )),
    }
}
