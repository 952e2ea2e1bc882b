//! The acceptance loop of a verify step.

/// What a verify step's rows gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Draft tokens kept (each was also the token sampled at its row).
    pub accepted: usize,
    /// Tokens emitted: the accepted drafts and the one sampled after them
    /// (fewer when the sequence ended on the way).
    pub emitted: usize,
    /// Whether the sequence ended (a stop, its length, a failure).
    pub ended: bool,
}

/// Runs the acceptance rule over `rows`, the logits after the last
/// emitted token and after each token of `draft` (`draft.len() + 1` rows,
/// or fewer). `emit` samples a row with the sequence's sampler, emits the
/// token and returns it, or `None` when the sequence ended.
///
/// Row `i + 1` is valid only if draft token `i` is what the sequence
/// emitted at row `i`, so the loop stops at the first sampled token that
/// differs from the draft: that token is emitted instead (a draw from `p`
/// that missed `d` is a draw from `p` without `d`, the residual of the
/// standard rule for a one-hot draft distribution).
pub fn verify<'r>(
    draft: &[u32],
    rows: impl IntoIterator<Item = &'r [f32]>,
    mut emit: impl FnMut(&'r [f32]) -> Option<u32>,
) -> Verdict {
    let mut verdict = Verdict {
        accepted: 0,
        emitted: 0,
        ended: false,
    };
    for (i, row) in rows.into_iter().enumerate() {
        let Some(token) = emit(row) else {
            verdict.ended = true;
            return verdict;
        };
        verdict.emitted += 1;
        if draft.get(i) != Some(&token) {
            break;
        }
        verdict.accepted += 1;
    }
    verdict
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::sampling::{Sampler, SamplingParams};

    #[test]
    fn drafts_are_kept_up_to_the_first_miss() {
        let rows: Vec<Vec<f32>> = (0..4).map(|i| vec![i as f32]).collect();
        let sampled = [7, 8, 5, 1];
        let mut at = 0;
        let verdict = verify(&[7, 8, 9], rows.iter().map(Vec::as_slice), |_| {
            at += 1;
            Some(sampled[at - 1])
        });
        assert_eq!(
            verdict,
            Verdict {
                accepted: 2,
                emitted: 3,
                ended: false
            }
        );
        // Every draft kept: the last row's token comes on top.
        let mut at = 0;
        let verdict = verify(&[7, 8, 5], rows.iter().map(Vec::as_slice), |_| {
            at += 1;
            Some(sampled[at - 1])
        });
        assert_eq!((verdict.accepted, verdict.emitted), (3, 4));
        // The sequence ending stops the loop.
        let verdict = verify(&[7, 8, 5], rows.iter().map(Vec::as_slice), |_| None);
        assert_eq!((verdict.emitted, verdict.ended), (0, true));
    }

    /// The textbook rule for a deterministic draft `d`: accept with
    /// probability `p(d)`, else draw from `max(p - onehot(d), 0)` normalised.
    fn textbook(p: &[f64], d: usize, rng: &mut ChaCha8Rng) -> usize {
        if rng.random::<f64>() < p[d] {
            return d;
        }
        let residual: Vec<f64> = p
            .iter()
            .enumerate()
            .map(|(i, &pi)| if i == d { 0.0 } else { pi })
            .collect();
        let total: f64 = residual.iter().sum();
        let mut target = rng.random::<f64>() * total;
        for (i, r) in residual.iter().enumerate() {
            if target < *r {
                return i;
            }
            target -= r;
        }
        residual.len() - 1
    }

    /// The sampler's distribution, worked out: softmax at `temperature`,
    /// then the smallest most likely set reaching `top_p`, renormalised.
    fn target(logits: &[f32], temperature: f32, top_p: f32) -> Vec<f64> {
        let scaled: Vec<f64> = logits
            .iter()
            .map(|&l| f64::from(l * (1.0 / temperature)))
            .collect();
        let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scaled.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]));
        let mut kept = vec![0.0; logits.len()];
        let mut cumulative = 0.0;
        for &i in &order {
            kept[i] = weights[i];
            cumulative += weights[i] / total;
            if cumulative >= f64::from(top_p) {
                break;
            }
        }
        let sum: f64 = kept.iter().sum();
        kept.iter().map(|w| w / sum).collect()
    }

    /// Pearson's chi-square of `counts` against probabilities `p` over `n` draws.
    fn chi_square(counts: &[u64], p: &[f64], n: u64) -> f64 {
        counts
            .iter()
            .zip(p)
            .map(|(&c, &pi)| {
                if pi == 0.0 {
                    // A token the target never gives is a failure outright.
                    return if c == 0 { 0.0 } else { f64::INFINITY };
                }
                let expected = pi * n as f64;
                (c as f64 - expected).powi(2) / expected
            })
            .sum()
    }

    /// The token emitted at a draft's row, and the one after it when the
    /// draft was kept, follow the target distribution: the rule as the
    /// engine runs it (the real sampler, temperature and top-p) against
    /// the sampler's distribution worked out, and the textbook rule
    /// against the same. 8 categories: chi-square's 99.9% point at 7 degrees of
    /// freedom is 24.3; the seeds are fixed, so this does not flake.
    #[test]
    fn the_emitted_distribution_is_the_target_distribution() {
        let logits = [2.0f32, 1.5, 1.0, 0.2, -0.5, 0.0, 1.2, -3.0];
        let params = SamplingParams {
            temperature: 0.8,
            top_p: 0.97,
            seed: Some(11),
            ..SamplingParams::default()
        };
        let p = target(&logits, params.temperature, params.top_p);
        let n: u64 = 200_000;
        let mut textbook_rng = ChaCha8Rng::seed_from_u64(3);
        for draft in [0u32, 3, 7] {
            let mut sampler = Sampler::new(SamplingParams {
                seed: Some(100 + u64::from(draft)),
                ..params.clone()
            });
            let mut first = vec![0u64; logits.len()];
            let mut second = vec![0u64; logits.len()];
            let mut book = vec![0u64; logits.len()];
            let mut kept = 0u64;
            for _ in 0..n {
                let mut emitted = Vec::new();
                let rows = [&logits[..], &logits[..]];
                let verdict = verify(&[draft], rows, |row| {
                    let id = sampler.sample(row, &[]).unwrap().id;
                    emitted.push(id);
                    Some(id)
                });
                first[emitted[0] as usize] += 1;
                if verdict.accepted == 1 {
                    kept += 1;
                    second[emitted[1] as usize] += 1;
                }
                book[textbook(&p, draft as usize, &mut textbook_rng)] += 1;
            }
            let p_draft = p[draft as usize];
            assert!(
                chi_square(&first, &p, n) < 24.3,
                "draft {draft}: {first:?} vs {p:?}"
            );
            assert!(
                chi_square(&book, &p, n) < 24.3,
                "textbook {draft}: {book:?}"
            );
            if kept > 1000 {
                assert!(
                    chi_square(&second, &p, kept) < 24.3,
                    "after {draft}: {second:?}"
                );
            }
            // Acceptance is p(d).
            let rate = kept as f64 / n as f64;
            let sd = (p_draft * (1.0 - p_draft) / n as f64).sqrt();
            assert!(
                (rate - p_draft).abs() < 4.0 * sd + 1e-9,
                "{rate} vs {p_draft}"
            );
        }
    }
}
