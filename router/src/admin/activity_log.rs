//! The samples behind `GET /admin/activity` (see `admin/activity.rs`): what one sample
//! holds, how many are kept, and how one is taken.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use crate::admin::model_admin::ModelAdmin;
use crate::metrics::token_totals;

/// How often a sample is taken.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// How many samples are kept: ten minutes at [`SAMPLE_EVERY`].
pub const KEEP: usize = 300;

/// One sample. Counters are totals since the server started; `queued` and `running`
/// are the executor's at that moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// Weight-table swaps between checkpoints.
    pub swaps: u64,
    /// Forward steps.
    pub steps: u64,
    /// Tokens generated, over every model.
    pub generated_tokens: u64,
    /// Prompt tokens processed, over every model.
    pub prompt_tokens: u64,
    /// Requests waiting for a batch slot.
    pub queued: u64,
    /// Sequences in the batch.
    pub running: u64,
}

/// The kept samples, oldest first.
#[derive(Default)]
pub struct ActivityLog {
    samples: Mutex<VecDeque<Sample>>,
}

impl ActivityLog {
    /// Appends `sample`, dropping the oldest beyond [`KEEP`].
    pub fn record(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == KEEP {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// The kept samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.iter().copied().collect()
    }
}

/// A sample of now: the executor's counters from [`ModelAdmin::status`] (zero without a
/// model adapter), the tokens from the router's totals.
pub fn take_sample(models: Option<&dyn ModelAdmin>) -> Sample {
    let status = models.map(|m| m.status()).unwrap_or(Value::Null);
    let executor = |field: &str| {
        status
            .get("executor")
            .and_then(|e| e.get(field))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let tokens = token_totals();
    Sample {
        at_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        swaps: executor("swaps"),
        steps: executor("steps"),
        generated_tokens: tokens.generated,
        prompt_tokens: tokens.prompt,
        queued: executor("queued"),
        running: executor("active_sequences"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_the_latest_samples_in_order() {
        let log = ActivityLog::default();
        for i in 0..(KEEP as u64 + 5) {
            log.record(Sample {
                at_unix_ms: i,
                ..Sample::default()
            });
        }
        let samples = log.samples();
        assert_eq!(samples.len(), KEEP);
        assert_eq!(samples[0].at_unix_ms, 5);
        assert_eq!(samples[KEEP - 1].at_unix_ms, KEEP as u64 + 4);
    }
}
