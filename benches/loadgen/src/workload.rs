//! What the clients send: a seeded schedule of requests (target model,
//! prompt, output length, and for open-loop traffic the arrival time), so
//! that every system in one run sees exactly the same requests.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Prompts of several lengths (a few words to a paragraph), so that prefill
/// cost varies the way it does in chat traffic.
const PROMPTS: &[&str] = &[
    "Write a short poem about the sea.",
    "Explain what a CPU cache is, and why a program that walks memory in order runs faster than one that jumps around.",
    "List five fruits and their colors.",
    "Summarise the plot of a detective story in which the butler is innocent, the gardener is suspicious, and the cat knows everything.",
    "What is the capital of France?",
    "Give three tips for writing clear documentation for a command line tool that many people will use.",
    "Translate 'good morning, how are you?' into Spanish and German.",
    "Describe how a train switchyard works: the tracks, the switches, and how cars are sorted into outgoing trains.",
];

/// Output lengths (max_tokens), drawn with these weights: mostly short
/// answers, some long ones.
const OUTPUT_LENGTHS: &[(u32, u32)] = &[(16, 3), (32, 4), (64, 2), (128, 1)];

/// How popular each model is.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Popularity {
    Uniform,
    /// Zipf with exponent `s`: model `i` (0-based) has weight 1/(i+1)^s.
    Zipf(f64),
}

impl std::str::FromStr for Popularity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "uniform" {
            return Ok(Popularity::Uniform);
        }
        let exponent = s.strip_prefix("zipf").ok_or(format!(
            "popularity `{s}`: expected `uniform` or `zipf[:S]`"
        ))?;
        match exponent.strip_prefix(':') {
            None if exponent.is_empty() => Ok(Popularity::Zipf(1.0)),
            Some(v) => v
                .parse()
                .map(Popularity::Zipf)
                .map_err(|_| format!("popularity `{s}`: bad exponent")),
            None => Err(format!("popularity `{s}`: expected `zipf:S`")),
        }
    }
}

/// One request of the schedule.
#[derive(Clone, Debug)]
pub struct Planned {
    /// Offset from the start of the run (open loop); unused in closed loop.
    pub at_seconds: f64,
    pub model: String,
    pub prompt: &'static str,
    pub max_tokens: u32,
}

/// Draws `count` requests. `rate` (requests/s) gives Poisson arrivals; with
/// `None` every arrival time is zero (closed loop sends them back to back).
pub fn schedule(
    seed: u64,
    models: &[String],
    popularity: Popularity,
    rate: Option<f64>,
    count: usize,
) -> Vec<Planned> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cumulative = cumulative_weights(models.len(), popularity);
    let total_length_weight: u32 = OUTPUT_LENGTHS.iter().map(|(_, w)| w).sum();
    let mut at = 0.0;
    (0..count)
        .map(|_| {
            if let Some(rate) = rate {
                // Exponential inter-arrival times; 1 - u keeps ln away from 0.
                let u: f64 = rng.random();
                at += -(1.0 - u).ln() / rate;
            }
            let pick: f64 = rng.random();
            let model_index = cumulative
                .iter()
                .position(|&c| pick < c)
                .unwrap_or(models.len() - 1);
            let mut length_pick = rng.random_range(0..total_length_weight);
            let max_tokens = OUTPUT_LENGTHS
                .iter()
                .find(|(_, w)| {
                    if length_pick < *w {
                        true
                    } else {
                        length_pick -= w;
                        false
                    }
                })
                .map_or(OUTPUT_LENGTHS[0].0, |(n, _)| *n);
            Planned {
                at_seconds: at,
                model: models[model_index].clone(),
                prompt: PROMPTS[rng.random_range(0..PROMPTS.len())],
                max_tokens,
            }
        })
        .collect()
}

/// Cumulative probabilities of the models, the last one exactly 1.
fn cumulative_weights(models: usize, popularity: Popularity) -> Vec<f64> {
    let weights: Vec<f64> = (0..models)
        .map(|i| match popularity {
            Popularity::Uniform => 1.0,
            Popularity::Zipf(s) => 1.0 / ((i + 1) as f64).powf(s),
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut running = 0.0;
    let mut cumulative: Vec<f64> = weights
        .iter()
        .map(|w| {
            running += w / total;
            running
        })
        .collect();
    if let Some(last) = cumulative.last_mut() {
        *last = 1.0;
    }
    cumulative
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(k: usize) -> Vec<String> {
        (0..k).map(|i| format!("m{i}")).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_does_not() {
        let a = schedule(7, &names(4), Popularity::Zipf(1.0), Some(2.0), 50);
        let b = schedule(7, &names(4), Popularity::Zipf(1.0), Some(2.0), 50);
        let c = schedule(8, &names(4), Popularity::Zipf(1.0), Some(2.0), 50);
        let key = |s: &[Planned]| {
            s.iter()
                .map(|p| (p.model.clone(), p.max_tokens, p.at_seconds.to_bits()))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&c));
    }

    #[test]
    fn poisson_arrivals_have_the_asked_mean_rate() {
        let plan = schedule(1, &names(2), Popularity::Uniform, Some(4.0), 4000);
        let rate = plan.len() as f64 / plan[plan.len() - 1].at_seconds;
        assert!((rate - 4.0).abs() < 0.3, "rate {rate}");
        assert!(plan.windows(2).all(|w| w[0].at_seconds <= w[1].at_seconds));
    }

    #[test]
    fn zipf_favours_the_first_model_and_uniform_does_not() {
        let share = |popularity| {
            let plan = schedule(3, &names(4), popularity, None, 8000);
            plan.iter().filter(|p| p.model == "m0").count() as f64 / plan.len() as f64
        };
        // Zipf(1) over 4 models: 1 / (1 + 1/2 + 1/3 + 1/4) = 0.48.
        assert!((share(Popularity::Zipf(1.0)) - 0.48).abs() < 0.03);
        assert!((share(Popularity::Uniform) - 0.25).abs() < 0.03);
    }

    #[test]
    fn popularity_parses() {
        assert_eq!("uniform".parse(), Ok(Popularity::Uniform));
        assert_eq!("zipf".parse(), Ok(Popularity::Zipf(1.0)));
        assert_eq!("zipf:1.2".parse(), Ok(Popularity::Zipf(1.2)));
        assert!("zipf:x".parse::<Popularity>().is_err());
        assert!("pareto".parse::<Popularity>().is_err());
    }
}
