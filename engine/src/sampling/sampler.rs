//! Picking one token from a row of logits.
//!
//! Order of operations: logit bias, penalties (over `history`), then — for
//! temperature > 0 — temperature, top-k, top-p, min-p, and a draw from what
//! is left. Reported log-probabilities are those of the biased and
//! penalised logits at temperature 1, before any truncation.

use std::borrow::Cow;
use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use switchyard_kernels::argmax::{argmax, largest, pick, Best};
use switchyard_seam::TokenMargin;

use super::spread::normalize;
use super::{SamplingError, SamplingParams};

/// The chosen token and its log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens, most likely first (empty unless requested).
    pub top_logprobs: Vec<(u32, f32)>,
    /// How decided the distribution it was picked from was (the same distribution as
    /// `logprob`'s).
    pub margin: TokenMargin,
}

/// Samples tokens for one sequence; owns its random stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    /// Reused working buffer: (token id, adjusted logit).
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for `params` (validate them first); seeded from
    /// `params.seed`, or from the OS when it is `None`.
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = match params.seed {
            Some(seed) => ChaCha20Rng::seed_from_u64(seed),
            None => ChaCha20Rng::from_rng(&mut rand::rng()),
        };
        Sampler {
            params,
            rng,
            candidates: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (one per vocabulary id), with
    /// `history` (the tokens the penalties count) already generated.
    pub fn sample(
        &mut self,
        logits: &[f32],
        history: &[u32],
    ) -> Result<SampledToken, SamplingError> {
        // The row is copied only to change it: every greedy token of a
        // plain request reads it as it is (`spread.rs` on why this pass counts).
        let changes = !self.params.logit_bias.is_empty() || penalizes(&self.params);
        let adjusted: Cow<'_, [f32]> = if changes || has_nan(logits) {
            let mut adjusted = logits.to_vec();
            for &(id, bias) in &self.params.logit_bias {
                if let Some(logit) = adjusted.get_mut(id as usize) {
                    *logit += bias;
                }
            }
            apply_penalties(&mut adjusted, history, &self.params);
            // NaN would poison every comparison below; treat it as impossible.
            for logit in &mut adjusted {
                if logit.is_nan() {
                    *logit = f32::NEG_INFINITY;
                }
            }
            Cow::Owned(adjusted)
        } else {
            Cow::Borrowed(logits)
        };
        let max = largest(&adjusted);
        if !max.is_finite() {
            return Err(SamplingError::NoFiniteLogits);
        }
        let (log_norm, margin) = normalize(&adjusted, max);

        let id = if self.params.temperature == 0.0 {
            // `argmax` with the maximum already found: one pass fewer
            // over the row.
            pick(&adjusted, [Best::with_value(&adjusted, 0, max)])
        } else {
            self.draw(&adjusted)
        };
        let logprob = adjusted
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |l| l - log_norm);
        let top_logprobs = top_n(&adjusted, self.params.top_logprobs)
            .into_iter()
            .map(|(id, logit)| (id, logit - log_norm))
            .collect();
        Ok(SampledToken {
            id,
            logprob,
            top_logprobs,
            margin,
        })
    }

    /// Temperature, truncation and a random draw over `adjusted`.
    fn draw(&mut self, adjusted: &[f32]) -> u32 {
        let params = &self.params;
        let inv_temperature = 1.0 / params.temperature;
        let candidates = &mut self.candidates;
        candidates.clear();
        candidates.extend(
            adjusted
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(id, &l)| (id as u32, l * inv_temperature)),
        );
        if params.top_k > 0 && params.top_k < candidates.len() {
            candidates.select_nth_unstable_by(params.top_k - 1, more_likely_first);
            candidates.truncate(params.top_k);
        }
        let max = candidates
            .iter()
            .map(|c| c.1)
            .fold(f32::NEG_INFINITY, f32::max);
        if params.top_p < 1.0 {
            candidates.sort_unstable_by(more_likely_first);
            let total: f64 = candidates
                .iter()
                .map(|c| f64::from((c.1 - max).exp()))
                .sum();
            let mut cumulative = 0.0;
            let mut keep = candidates.len();
            for (i, c) in candidates.iter().enumerate() {
                cumulative += f64::from((c.1 - max).exp()) / total;
                if cumulative >= f64::from(params.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            candidates.truncate(keep);
        }
        if params.min_p > 0.0 {
            // p >= min_p * p_max  <=>  logit >= max_logit + ln(min_p)
            let floor = max + params.min_p.ln();
            candidates.retain(|c| c.1 >= floor);
        }

        let weights: Vec<f64> = candidates
            .iter()
            .map(|c| f64::from((c.1 - max).exp()))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut target = self.rng.random::<f64>() * total;
        for (c, w) in candidates.iter().zip(&weights) {
            if target < *w {
                return c.0;
            }
            target -= w;
        }
        // Rounding left the target past the end: the last kept candidate.
        candidates.last().map_or_else(|| argmax(adjusted), |c| c.0)
    }
}

/// Orders candidates most likely first, lower id first on ties.
fn more_likely_first(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `n` most likely (id, logit) pairs, most likely first.
fn top_n(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let mut all: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    if n < all.len() {
        all.select_nth_unstable_by(n - 1, more_likely_first);
        all.truncate(n);
    }
    all.sort_unstable_by(more_likely_first);
    all
}

/// Whether `params` penalise seen tokens at all.
fn penalizes(params: &SamplingParams) -> bool {
    params.repetition_penalty != 1.0
        || params.presence_penalty != 0.0
        || params.frequency_penalty != 0.0
}

/// Whether any logit is NaN (every entry looked at: no early exit, so it vectorizes).
fn has_nan(logits: &[f32]) -> bool {
    logits.iter().fold(false, |nan, l| nan | l.is_nan())
}

/// Repetition (CTRL / llama.cpp), presence and frequency (OpenAI) penalties.
fn apply_penalties(logits: &mut [f32], history: &[u32], params: &SamplingParams) {
    if !penalizes(params) {
        return;
    }
    let repetition = params.repetition_penalty;
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &id in history {
        *counts.entry(id).or_insert(0) += 1;
    }
    for (id, count) in counts {
        let Some(logit) = logits.get_mut(id as usize) else {
            continue;
        };
        if *logit > 0.0 {
            *logit /= repetition;
        } else {
            *logit *= repetition;
        }
        *logit -= params.presence_penalty + count as f32 * params.frequency_penalty;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn greedy_breaks_ties_toward_the_lowest_id() {
        let mut sampler = Sampler::new(SamplingParams::default());
        let token = sampler.sample(&[1.0, 3.0, 3.0, -2.0], &[]).unwrap();
        assert_eq!(token.id, 1);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let p = params(|p| p.repetition_penalty = 2.0);
        let mut logits = vec![4.0, -1.0, 3.0];
        apply_penalties(&mut logits, &[0, 1, 0], &p);
        assert_eq!(logits, vec![2.0, -2.0, 3.0]);
    }

    #[test]
    fn presence_subtracts_once_and_frequency_per_occurrence() {
        let p = params(|p| {
            p.presence_penalty = 0.5;
            p.frequency_penalty = 0.25;
        });
        let mut logits = vec![1.0, 1.0, 1.0];
        apply_penalties(&mut logits, &[0, 0, 0, 2], &p);
        assert_eq!(logits, vec![1.0 - 0.5 - 0.75, 1.0, 1.0 - 0.5 - 0.25]);
    }

    #[test]
    fn penalties_change_the_greedy_choice() {
        let p = params(|p| p.frequency_penalty = 2.0);
        let mut sampler = Sampler::new(p);
        assert_eq!(sampler.sample(&[2.0, 1.5], &[0]).unwrap().id, 1);
    }

    #[test]
    fn logit_bias_is_added() {
        let p = params(|p| p.logit_bias = vec![(2, 5.0)]);
        let mut sampler = Sampler::new(p);
        assert_eq!(sampler.sample(&[1.0, 2.0, 0.0], &[]).unwrap().id, 2);
    }

    #[test]
    fn logprobs_are_log_softmax_and_top_logprobs_are_sorted() {
        let p = params(|p| p.top_logprobs = 2);
        let mut sampler = Sampler::new(p);
        let token = sampler.sample(&[0.0, 0.0, (2.0f32).ln()], &[]).unwrap();
        assert_eq!(token.id, 2);
        assert!((token.logprob - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(token.top_logprobs.len(), 2);
        assert_eq!(token.top_logprobs[0].0, 2);
        assert_eq!(token.top_logprobs[1].0, 0);
        assert!((token.top_logprobs[1].1 - 0.25f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn nan_and_empty_logits_are_errors_or_ignored() {
        let mut sampler = Sampler::new(SamplingParams::default());
        assert!(sampler.sample(&[], &[]).is_err());
        assert!(sampler.sample(&[f32::NAN, f32::NEG_INFINITY], &[]).is_err());
        assert_eq!(sampler.sample(&[f32::NAN, 1.0], &[]).unwrap().id, 1);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let p = params(|p| {
            p.temperature = 1.0;
            p.seed = Some(7);
        });
        let mut sampler = Sampler::new(p);
        let logits = [0.0, (3.0f32).ln()];
        let ones = (0..4000)
            .filter(|_| sampler.sample(&logits, &[]).unwrap().id == 1)
            .count();
        // Expected 3000 of 4000; 5 standard deviations is about 137.
        assert!((2860..3140).contains(&ones), "{ones}");
    }

    #[test]
    fn a_row_read_in_place_samples_as_its_copy() {
        let logits: Vec<f32> = (0..5000u32)
            .map(|i| ((i * 7919) % 1000) as f32 / 97.0 - 4.0)
            .collect();
        for temperature in [0.0, 0.8] {
            let plain = params(|p| {
                p.temperature = temperature;
                p.top_logprobs = 3;
                p.seed = Some(5);
            });
            // A bias (of nothing) makes the sampler copy the row.
            let copied = SamplingParams {
                logit_bias: vec![(11, 0.0)],
                ..plain.clone()
            };
            let (mut a, mut b) = (Sampler::new(plain), Sampler::new(copied));
            for _ in 0..20 {
                let (x, y) = (
                    a.sample(&logits, &[]).expect("finite logits"),
                    b.sample(&logits, &[]).expect("finite logits"),
                );
                assert_eq!((x.id, x.logprob.to_bits()), (y.id, y.logprob.to_bits()));
                assert_eq!(x.top_logprobs, y.top_logprobs);
                assert_eq!(x.margin, y.margin);
            }
        }
    }
}
