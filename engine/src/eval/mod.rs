//! Evaluation suites run inside the engine: multiple-choice items scored
//! by log-likelihood, generation items by greedy exact match, batched on
//! the same forward pass that serves requests.
//!
//! ```no_run
//! use switchyard_engine::eval::{evaluate, EvalOptions, Suite};
//! use switchyard_engine::formats::load_checkpoint;
//! use switchyard_engine::model::LlamaModel;
//! use switchyard_engine::tokenizer::Tokenizer;
//! use switchyard_kernels::Backend;
//!
//! fn score<B: Backend>(backend: &B) -> Result<(), Box<dyn std::error::Error>> {
//!     let checkpoint = load_checkpoint(std::path::Path::new("model.gguf"))?;
//!     let model = LlamaModel::load(backend, &checkpoint)?;
//!     let tokenizer = Tokenizer::load(&checkpoint.tokenizer)?;
//!     let suite = Suite::load(std::path::Path::new("evals/arith-mc.jsonl"))?;
//!     let report = evaluate(backend, &model, &tokenizer, &suite, &EvalOptions::default())?;
//!     println!("acc {:.3} over {} items", report.summary.acc, report.summary.n);
//!     Ok(())
//! }
//! ```

mod cache;
mod encode;
mod error;
pub mod gate;
mod greedy;
mod loglik;
pub mod normalize;
pub mod quality;
mod stats;
mod suite;

use serde::Serialize;
use switchyard_kernels::Backend;

use crate::model::LlamaModel;
use crate::tokenizer::Tokenizer;

pub use encode::{encode_choices, ChoiceTokens};
pub use error::EvalError;
pub use loglik::{log_prob, shares_context, Scorer};
pub use stats::{wilson95, Summary};
pub use suite::{suite_name, Item, Suite, Task};

/// How a suite is run.
#[derive(Clone, Debug)]
pub struct EvalOptions {
    /// Tokens a multiple-choice batch feeds at most (bounds activations and KV).
    pub batch_tokens: usize,
    /// Generation items decoded together.
    pub generate_batch: usize,
    /// Tokens a generation item may produce.
    pub max_tokens: usize,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            batch_tokens: 1024,
            generate_batch: 16,
            max_tokens: 24,
        }
    }
}

/// One item's outcome.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ItemResult {
    Choice {
        line: usize,
        answer: usize,
        /// The likeliest choice, and the likeliest per byte.
        pred: usize,
        pred_norm: usize,
        /// Each choice's log-likelihood (natural log).
        logliks: Vec<f64>,
        /// Each choice's length in bytes (the `acc_norm` divisor).
        bytes: Vec<usize>,
        context_ids: Vec<u32>,
        choice_ids: Vec<Vec<u32>>,
    },
    Generate {
        line: usize,
        answer: String,
        output: String,
        correct: bool,
    },
}

impl ItemResult {
    fn correct(&self) -> (bool, bool) {
        match self {
            ItemResult::Choice {
                answer,
                pred,
                pred_norm,
                ..
            } => (pred == answer, pred_norm == answer),
            ItemResult::Generate { correct, .. } => (*correct, *correct),
        }
    }
}

/// A suite's summary and each item's outcome, in suite order.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub summary: Summary,
    pub items: Vec<ItemResult>,
}

/// Runs every item of `suite` on `model` (see the module documentation).
pub fn evaluate<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    tokenizer: &Tokenizer,
    suite: &Suite,
    options: &EvalOptions,
) -> Result<Report, EvalError> {
    evaluate_adapted(backend, model, None, tokenizer, suite, options)
}

/// [`evaluate`] with `adapter`'s LoRA updates over the base model on every row.
pub fn evaluate_adapted<B: Backend>(
    backend: &B,
    model: &LlamaModel<B>,
    adapter: Option<&crate::adapter::ResidentAdapter<B>>,
    tokenizer: &Tokenizer,
    suite: &Suite,
    options: &EvalOptions,
) -> Result<Report, EvalError> {
    let mut scorer = Scorer::new(backend, model).with_adapter(adapter);
    let mut results: Vec<Option<ItemResult>> = vec![None; suite.items.len()];
    run_choices(&mut scorer, tokenizer, suite, options, &mut results)?;
    run_generations(&mut scorer, tokenizer, suite, options, &mut results)?;
    let items: Vec<ItemResult> = results.into_iter().flatten().collect();
    let (mut correct, mut correct_norm) = (0, 0);
    for item in &items {
        let (c, n) = item.correct();
        correct += usize::from(c);
        correct_norm += usize::from(n);
    }
    Ok(Report {
        summary: Summary::new(items.len(), correct, correct_norm),
        items,
    })
}

/// Index of the largest value (the first on ties).
fn best(values: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

fn run_choices<B: Backend>(
    scorer: &mut Scorer<'_, B>,
    tokenizer: &Tokenizer,
    suite: &Suite,
    options: &EvalOptions,
    results: &mut [Option<ItemResult>],
) -> Result<(), EvalError> {
    let context = scorer.model().config().context_length;
    // Work units: an item whose choices share its context's KV, or one
    // choice of an item too long for that (see `loglik`).
    struct Unit {
        item: usize,
        choice: Option<usize>,
        tokens: ChoiceTokens,
    }
    let mut units = Vec::new();
    let mut encoded = Vec::new();
    for (index, item) in suite.items.iter().enumerate() {
        let Task::Choice {
            context: text,
            choices,
            ..
        } = &item.task
        else {
            continue;
        };
        let tokens = encode_choices(tokenizer, text, choices, item.line)?;
        if tokens.capacity() > context {
            return Err(EvalError::TooLong {
                line: item.line,
                tokens: tokens.capacity(),
                context,
            });
        }
        if shares_context(scorer.model(), &tokens) {
            units.push(Unit {
                item: index,
                choice: None,
                tokens: tokens.clone(),
            });
        } else {
            for (j, choice) in tokens.choices.iter().enumerate() {
                units.push(Unit {
                    item: index,
                    choice: Some(j),
                    tokens: ChoiceTokens {
                        context: tokens.context.clone(),
                        choices: vec![choice.clone()],
                    },
                });
            }
        }
        encoded.push((index, tokens));
    }

    let mut logliks: Vec<Vec<f64>> = suite
        .items
        .iter()
        .map(|item| match &item.task {
            Task::Choice { choices, .. } => vec![0.0; choices.len()],
            Task::Generate { .. } => Vec::new(),
        })
        .collect();
    let mut start = 0;
    while start < units.len() {
        let mut end = start;
        let mut tokens = 0;
        while end < units.len()
            && (end == start || tokens + units[end].tokens.fed_tokens() <= options.batch_tokens)
        {
            tokens += units[end].tokens.fed_tokens();
            end += 1;
        }
        let batch: Vec<&ChoiceTokens> = units[start..end].iter().map(|u| &u.tokens).collect();
        let scores = scorer.score(&batch)?;
        for (unit, score) in units[start..end].iter().zip(scores) {
            match unit.choice {
                None => logliks[unit.item] = score,
                Some(j) => logliks[unit.item][j] = score.first().copied().unwrap_or(f64::NAN),
            }
        }
        start = end;
    }

    for (index, tokens) in encoded {
        let Task::Choice {
            choices, answer, ..
        } = &suite.items[index].task
        else {
            continue;
        };
        let scores = std::mem::take(&mut logliks[index]);
        let bytes: Vec<usize> = choices.iter().map(String::len).collect();
        let pred = best(scores.iter().copied());
        let pred_norm = best(scores.iter().zip(&bytes).map(|(s, &b)| s / b as f64));
        results[index] = Some(ItemResult::Choice {
            line: suite.items[index].line,
            answer: *answer,
            pred,
            pred_norm,
            logliks: scores,
            bytes,
            context_ids: tokens.context,
            choice_ids: tokens.choices,
        });
    }
    Ok(())
}

fn run_generations<B: Backend>(
    scorer: &mut Scorer<'_, B>,
    tokenizer: &Tokenizer,
    suite: &Suite,
    options: &EvalOptions,
    results: &mut [Option<ItemResult>],
) -> Result<(), EvalError> {
    let context = scorer.model().config().context_length;
    let mut pending = Vec::new();
    for (index, item) in suite.items.iter().enumerate() {
        if let Task::Generate { prompt, answer } = &item.task {
            let ids = tokenizer.encode(prompt, true)?;
            if ids.len() >= context {
                return Err(EvalError::TooLong {
                    line: item.line,
                    tokens: ids.len() + 1,
                    context,
                });
            }
            pending.push((index, ids, answer));
        }
    }
    for batch in pending.chunks(options.generate_batch.max(1)) {
        let prompts: Vec<&[u32]> = batch.iter().map(|(_, ids, _)| ids.as_slice()).collect();
        let outputs = greedy::generate(scorer, tokenizer, &prompts, options.max_tokens)?;
        for ((index, _, answer), output) in batch.iter().zip(outputs) {
            results[*index] = Some(ItemResult::Generate {
                line: suite.items[*index].line,
                answer: (*answer).clone(),
                correct: normalize::matches(&output, answer),
                output,
            });
        }
    }
    Ok(())
}
