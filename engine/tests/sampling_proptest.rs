//! Property tests of the sampler and the stop checker.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use proptest::prelude::*;
use switchyard_engine::sampling::{
    FinishReason, Sampler, SamplingParams, StopChecker, StopCondition,
};

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-20.0f32..20.0, 1..200)
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| (f64::from(l - max) / f64::from(temperature)).exp())
        .collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(|x| x / total).collect()
}

proptest! {
    #[test]
    fn greedy_is_argmax(logits in logits_strategy()) {
        let mut sampler = Sampler::new(SamplingParams::default());
        let id = sampler.sample(&logits, &[]).unwrap().id as usize;
        let best = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        prop_assert_eq!(logits[id], best);
        // Lowest id on ties.
        prop_assert!(logits[..id].iter().all(|&l| l < best));
    }

    #[test]
    fn top_k_never_returns_a_filtered_token(
        logits in logits_strategy(), k in 1usize..10, seed in any::<u64>(), temperature in 0.1f32..3.0,
    ) {
        let params = SamplingParams { temperature, top_k: k, seed: Some(seed), ..SamplingParams::default() };
        let mut sampler = Sampler::new(params);
        for _ in 0..20 {
            let id = sampler.sample(&logits, &[]).unwrap().id as usize;
            let better = logits.iter().filter(|&&l| l > logits[id]).count();
            prop_assert!(better < k, "token {} has {} better tokens, k = {}", id, better, k);
        }
    }

    #[test]
    fn top_p_never_returns_a_filtered_token(
        logits in logits_strategy(), top_p in 0.05f32..1.0, seed in any::<u64>(), temperature in 0.1f32..3.0,
    ) {
        let params = SamplingParams { temperature, top_p, seed: Some(seed), ..SamplingParams::default() };
        let mut sampler = Sampler::new(params);
        let probs = softmax(&logits, temperature);
        for _ in 0..20 {
            let id = sampler.sample(&logits, &[]).unwrap().id as usize;
            // Everything strictly more likely than the pick must not yet reach top_p.
            let mass_above: f64 = probs.iter().filter(|&&p| p > probs[id]).sum();
            prop_assert!(mass_above < f64::from(top_p) + 1e-6, "mass above {} >= top_p {}", mass_above, top_p);
        }
    }

    #[test]
    fn min_p_never_returns_a_filtered_token(
        logits in logits_strategy(), min_p in 0.01f32..1.0, seed in any::<u64>(), temperature in 0.1f32..3.0,
    ) {
        let params = SamplingParams { temperature, min_p, seed: Some(seed), ..SamplingParams::default() };
        let mut sampler = Sampler::new(params);
        let probs = softmax(&logits, temperature);
        let p_max = probs.iter().copied().fold(0.0, f64::max);
        for _ in 0..20 {
            let id = sampler.sample(&logits, &[]).unwrap().id as usize;
            prop_assert!(probs[id] >= f64::from(min_p) * p_max * (1.0 - 1e-4));
        }
    }

    #[test]
    fn same_seed_same_tokens(logits in logits_strategy(), seed in any::<u64>()) {
        let params = SamplingParams { temperature: 1.0, top_p: 0.9, seed: Some(seed), ..SamplingParams::default() };
        let mut a = Sampler::new(params.clone());
        let mut b = Sampler::new(params);
        let run_a: Vec<u32> = (0..32).map(|_| a.sample(&logits, &[]).unwrap().id).collect();
        let run_b: Vec<u32> = (0..32).map(|_| b.sample(&logits, &[]).unwrap().id).collect();
        prop_assert_eq!(run_a, run_b);
    }

    #[test]
    fn penalties_follow_their_definitions(
        logits in prop::collection::vec(-5.0f32..5.0, 2..20),
        history in prop::collection::vec(0u32..20, 0..30),
        repetition in 0.5f32..2.0, presence in -2.0f32..2.0, frequency in -2.0f32..2.0,
    ) {
        // Reads the penalised logits back through top_logprobs (log-softmax).
        let n = logits.len();
        let params = SamplingParams {
            repetition_penalty: repetition, presence_penalty: presence, frequency_penalty: frequency,
            top_logprobs: n.min(20), ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params);
        let token = sampler.sample(&logits, &history).unwrap();
        let mut expected = logits.clone();
        for (id, logit) in expected.iter_mut().enumerate() {
            let count = history.iter().filter(|&&h| h as usize == id).count();
            if count > 0 {
                *logit = if *logit > 0.0 { *logit / repetition } else { *logit * repetition };
                *logit -= presence + count as f32 * frequency;
            }
        }
        let max = expected.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_norm = max + expected.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
        for (id, logprob) in token.top_logprobs {
            prop_assert!((expected[id as usize] - log_norm - logprob).abs() < 1e-4);
        }
    }

    #[test]
    fn stop_strings_are_found_however_text_is_split(
        before in "[a-z ]{0,20}", after in "[a-z ]{0,10}", cuts in prop::collection::vec(0usize..40, 0..6),
    ) {
        let stop = "<|stop|>";
        let full = format!("{before}{stop}{after}");
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < full.len()).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces = Vec::new();
        let mut last = 0;
        for c in cuts.into_iter().chain([full.len()]) {
            pieces.push(&full[last..c]);
            last = c;
        }
        let mut checker = StopChecker::new(StopCondition {
            stop_strings: vec![stop.to_string()],
            ..StopCondition::default()
        });
        let mut out = String::new();
        let mut finished = None;
        for (i, piece) in pieces.iter().enumerate() {
            let step = checker.push(i as u32, piece);
            out.push_str(&step.text);
            if step.finished.is_some() {
                finished = step.finished;
                break;
            }
        }
        prop_assert_eq!(finished, Some(FinishReason::Stop));
        prop_assert_eq!(out, before);
    }

    #[test]
    fn text_without_stops_is_released_whole(
        text in "[a-z<|]{0,40}", cuts in prop::collection::vec(0usize..40, 0..6),
    ) {
        let stop = "<|stop|>";
        prop_assume!(!text.contains(stop));
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < text.len()).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut checker = StopChecker::new(StopCondition {
            stop_strings: vec![stop.to_string()],
            ..StopCondition::default()
        });
        let mut out = String::new();
        let mut last = 0;
        for (i, c) in cuts.into_iter().chain([text.len()]).enumerate() {
            let step = checker.push(i as u32, &text[last..c]);
            prop_assert_eq!(step.finished, None);
            out.push_str(&step.text);
            last = c;
        }
        out.push_str(&checker.flush());
        prop_assert_eq!(out, text);
    }
}
