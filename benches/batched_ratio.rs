//! Batched decode measured interleaved: each round times every batch size
//! (1, 4, 16, 64) back to back, in alternating order, so that every ratio
//! against batch 1 compares measurements taken seconds apart under the
//! same load. The shared machines this runs on change speed by tens of
//! percent from one minute to the next; a ratio of two medians measured
//! minutes apart (criterion's `batched_decode`) moves with that, a median
//! of per-round ratios much less.
//!
//! `cargo bench --bench batched_ratio -- [rounds]` (default 15); threads
//! from `SWITCHYARD_BENCH_THREADS` (default 2). Prints per-batch tok/s and
//! per-round ratios (median, range) as Markdown.

#[path = "support/batched.rs"]
mod batched;
#[path = "support/device.rs"]
mod device;
#[path = "support/rounds.rs"]
mod rounds;

use std::sync::Arc;
use std::time::Duration;

use batched::{decode_steps, load_model, threads, BATCHES, STEPS};
use device::on_bench_device;
use rounds::{rounds_arg, summary};
use switchyard_kernels::device::OnDevice;
use switchyard_kernels::Backend;

/// Each measurement repeats timed runs until it has this much decode time,
/// so the short batch-1 runs are not one scheduler hiccup long.
const MIN_MEASURED: Duration = Duration::from_millis(250);
/// The target for batch 16 against batch 1.
const TARGET_B16: f64 = 6.0;

fn main() {
    let rounds = rounds_arg(15);
    let rates = on_bench_device(threads(), Rounds(rounds));
    report(&rates, threads());
}

/// `rounds` interleaved rounds on whichever backend
/// `SWITCHYARD_BENCH_DEVICE` names: `rates[round][batch index]`, tok/s.
struct Rounds(usize);

impl OnDevice for Rounds {
    type Output = Vec<[f64; BATCHES.len()]>;

    fn run<B: Backend>(self, backend: Arc<B>) -> Self::Output {
        rounds_on(&*backend, self.0)
    }
}

fn rounds_on<B: Backend>(backend: &B, rounds: usize) -> Vec<[f64; BATCHES.len()]> {
    let model = load_model(backend);
    let mut scratch = model.new_scratch(backend);
    // Warm-up: page in the weights and grow the scratch to batch 64.
    for batch in BATCHES {
        decode_steps(backend, &model, &mut scratch, batch);
    }
    // rates[round][batch index], tokens per second.
    let mut rates = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..BATCHES.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut rate = [0.0; BATCHES.len()];
        for i in order {
            let batch = BATCHES[i];
            let (mut elapsed, mut runs) = (Duration::ZERO, 0);
            while elapsed < MIN_MEASURED {
                elapsed += decode_steps(backend, &model, &mut scratch, batch);
                runs += 1;
            }
            rate[i] = (batch * STEPS * runs) as f64 / elapsed.as_secs_f64();
        }
        eprintln!(
            "round {round}: {}",
            BATCHES
                .iter()
                .zip(rate)
                .map(|(b, r)| format!("b{b} {r:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rates.push(rate);
    }
    rates
}

fn report(rates: &[[f64; BATCHES.len()]], threads: usize) {
    println!("| batch | tok/s median (range) | ratio to batch 1, median of rounds (range) |");
    println!("| --- | --- | --- |");
    for (i, batch) in BATCHES.iter().enumerate() {
        let tok: Vec<f64> = rates.iter().map(|r| r[i]).collect();
        let ratio: Vec<f64> = rates.iter().map(|r| r[i] / r[0]).collect();
        let (tm, tlo, thi) = summary(&tok);
        let (rm, rlo, rhi) = summary(&ratio);
        println!("| {batch} | {tm:.1} ({tlo:.1}-{thi:.1}) | {rm:.2}x ({rlo:.2}-{rhi:.2}) |");
    }
    let b16 = BATCHES.iter().position(|&b| b == 16).unwrap_or(0);
    let met = rates.iter().filter(|r| r[b16] / r[0] >= TARGET_B16).count();
    println!(
        "\n{} rounds, {threads} threads, {STEPS} steps per run: batch 16 reached \
         {TARGET_B16}x batch 1 in {met} of {} rounds.",
        rates.len(),
        rates.len()
    );
}
