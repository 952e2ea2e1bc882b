//! Where a decode step's time goes, stage by stage, plain steps and verify
//! steps apart: a measuring aid, on only when `SWITCHYARD_STEP_PROFILE`
//! is set (`docs/bench/speculation.md` reads it).
//!
//! The executor marks the end of each stage of a step; a step where every
//! sequence decodes (no prompt row) is counted under its row count (1: a
//! plain step of one sequence). When the executor runs out of work it
//! prints the totals so far to stderr, one line per row count, in
//! microseconds per step. Steps with prompt rows are left out: they are not
//! what speculation changes.

use std::time::{Duration, Instant};

/// The environment variable that turns the profile on.
pub const STEP_PROFILE_ENV: &str = "SWITCHYARD_STEP_PROFILE";

/// A step's stages in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Accepting requests, admission and bookkeeping since the last step.
    Between,
    /// Each decoding sequence's draft lookup (`Group::draft`).
    Draft,
    /// Claims, the lead checkpoint and the step's spans.
    Plan,
    /// The chunks: each sequence's KV blocks for its rows.
    Chunks,
    /// The forward pass (logits of every row that needs them included).
    Forward,
    /// Sampling, acceptance, KV rollback, the controller and streaming.
    Finish,
}

const STAGES: [Stage; 6] = [
    Stage::Between,
    Stage::Draft,
    Stage::Plan,
    Stage::Chunks,
    Stage::Forward,
    Stage::Finish,
];

/// Row counts kept apart; larger steps share the last slot.
const ROWS: usize = 18;

/// Totals of one row count's steps.
#[derive(Clone, Copy, Default)]
struct Totals {
    steps: u64,
    /// Tokens the steps emitted (kept drafts and one more per sequence).
    tokens: u64,
    stages: [Duration; STAGES.len()],
}

/// The running profile; inert unless [`STEP_PROFILE_ENV`] was set.
pub(super) struct StepProfile {
    on: bool,
    /// When the stage in progress began.
    since: Instant,
    /// This step's stages so far.
    step: [Duration; STAGES.len()],
    by_rows: [Totals; ROWS],
}

impl StepProfile {
    /// A profile that records when [`STEP_PROFILE_ENV`] is set.
    pub(super) fn from_env() -> Self {
        StepProfile {
            on: std::env::var_os(STEP_PROFILE_ENV).is_some(),
            since: Instant::now(),
            step: [Duration::ZERO; STAGES.len()],
            by_rows: [Totals::default(); ROWS],
        }
    }

    /// A step begins: what the last one left unfinished (it ran nothing)
    /// is dropped, and the time since it counts as [`Stage::Between`].
    pub(super) fn start_step(&mut self) {
        self.step = [Duration::ZERO; STAGES.len()];
        self.mark(Stage::Between);
    }

    /// Whether it records (the executor counts a step's rows only then).
    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// The executor woke from idle: the wait is no stage's.
    pub(super) fn resume(&mut self) {
        if self.on {
            self.since = Instant::now();
        }
    }

    /// `stage` ended now.
    pub(super) fn mark(&mut self, stage: Stage) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        if let Some(slot) = STAGES.iter().position(|&s| s == stage) {
            self.step[slot] += now.duration_since(self.since);
        }
        self.since = now;
    }

    /// The step ended: count it under `rows` (`None`: it ran prompt rows,
    /// or nothing) with `tokens` emitted.
    pub(super) fn end_step(&mut self, rows: Option<usize>, tokens: usize) {
        if !self.on {
            return;
        }
        let step = std::mem::replace(&mut self.step, [Duration::ZERO; STAGES.len()]);
        let Some(rows) = rows.filter(|&r| r > 0) else {
            return;
        };
        let Some(totals) = self.by_rows.get_mut(rows.min(ROWS) - 1) else {
            return;
        };
        totals.steps += 1;
        totals.tokens += tokens as u64;
        for (total, spent) in totals.stages.iter_mut().zip(step) {
            *total += spent;
        }
    }

    /// Prints the totals so far (the executor has no work left).
    pub(super) fn report(&self) {
        if !self.on {
            return;
        }
        for (i, totals) in self.by_rows.iter().enumerate() {
            if totals.steps == 0 {
                continue;
            }
            let per_step = |d: Duration| d.as_secs_f64() * 1e6 / totals.steps as f64;
            let stages: Vec<String> = STAGES
                .iter()
                .zip(totals.stages)
                .map(|(stage, spent)| format!("{stage:?} {:.1}", per_step(spent)))
                .collect();
            eprintln!(
                "step profile: rows {}{} steps {} tokens {} us/step: {}",
                i + 1,
                if i + 1 == ROWS { "+" } else { "" },
                totals.steps,
                totals.tokens,
                stages.join(", ")
            );
        }
    }
}
