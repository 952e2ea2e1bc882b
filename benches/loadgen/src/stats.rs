//! One run's records reduced to the report's figures.

use serde::{Deserialize, Serialize};

use crate::client::Record;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    pub requests: usize,
    pub failed: usize,
    /// Generated tokens per second of wall time (first send to last end).
    pub tokens_per_second: f64,
    pub requests_per_second: f64,
    /// p50, p90, p99 in milliseconds over the successful requests.
    pub ttft_ms: [f64; 3],
    pub e2e_ms: [f64; 3],
    pub inter_token_ms: [f64; 3],
}

pub fn summarize(records: &[Record]) -> Summary {
    let ok: Vec<&Record> = records.iter().filter(|r| r.ok).collect();
    let first = records
        .iter()
        .map(|r| r.sent_at)
        .fold(f64::INFINITY, f64::min);
    let last = records
        .iter()
        .map(|r| r.sent_at + r.e2e_ms / 1000.0)
        .fold(0.0, f64::max);
    let wall = (last - first).max(1e-9);
    let tokens: u64 = ok.iter().map(|r| r.tokens).sum();
    let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
    let mut e2e: Vec<f64> = ok.iter().map(|r| r.e2e_ms).collect();
    let mut itl: Vec<f64> = ok
        .iter()
        .flat_map(|r| r.inter_token_ms.iter().copied())
        .collect();
    Summary {
        requests: records.len(),
        failed: records.len() - ok.len(),
        tokens_per_second: if records.is_empty() {
            0.0
        } else {
            tokens as f64 / wall
        },
        requests_per_second: if records.is_empty() {
            0.0
        } else {
            ok.len() as f64 / wall
        },
        ttft_ms: percentiles(&mut ttft),
        e2e_ms: percentiles(&mut e2e),
        inter_token_ms: percentiles(&mut itl),
    }
}

/// p50, p90, p99 by nearest rank; zeros when there is nothing to rank.
pub fn percentiles(values: &mut [f64]) -> [f64; 3] {
    values.sort_by(f64::total_cmp);
    [0.50, 0.90, 0.99].map(|q| quantile(values, q))
}

/// The `q` quantile of sorted values by nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(sent_at: f64, e2e_ms: f64, ok: bool, tokens: u64) -> Record {
        Record {
            model: "m".into(),
            sent_at,
            status: if ok { 200 } else { 0 },
            ok,
            error: None,
            ttft_ms: ok.then_some(e2e_ms / 2.0),
            inter_token_ms: vec![1.0; tokens.saturating_sub(1) as usize],
            e2e_ms,
            tokens,
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentiles(&mut values), [50.0, 90.0, 99.0]);
        assert_eq!(percentiles(&mut []), [0.0; 3]);
        assert_eq!(quantile(&[5.0], 0.99), 5.0);
    }

    #[test]
    fn failures_count_but_do_not_enter_latency_or_throughput() {
        let records = vec![
            record(0.0, 1000.0, true, 10),
            record(0.5, 500.0, true, 10),
            record(0.2, 60_000.0, false, 0),
        ];
        let s = summarize(&records);
        assert_eq!((s.requests, s.failed), (2 + 1, 1));
        // Wall time runs to the failed request's end (60.2 s).
        assert!((s.tokens_per_second - 20.0 / 60.2).abs() < 1e-9);
        assert_eq!(s.e2e_ms, [500.0, 1000.0, 1000.0]);
        assert_eq!(s.ttft_ms, [250.0, 500.0, 500.0]);
    }
}
