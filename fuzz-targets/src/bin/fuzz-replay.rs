//! Stable-toolchain fuzzing without instrumentation: each target replays its corpus
//! (`fuzz/corpus/<target>/`, what libFuzzer found), its regressions
//! (`fuzz-targets/regressions/<target>/`) and its seeds, then runs blind mutations of
//! them for the time given. A panic is a crash: the input is written to
//! `fuzz/artifacts/<target>/` and the run exits with status 1.
//!
//!   fuzz-replay [SECONDS_PER_TARGET] [TARGET...]
//!
//! Where `cargo fuzz` (libFuzzer, coverage-guided) can run, `scripts/fuzz.sh` uses it;
//! this is its fallback, and what CI can always run.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use switchyard_fuzz_targets::mutate::{mutate, Rng};
use switchyard_fuzz_targets::{seeds::seeds, target, Target, TARGETS};

const MAX_LEN: usize = 65_536;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = match args.next().map(|s| s.parse()) {
        None => 60.0,
        Some(Ok(s)) => s,
        Some(Err(_)) => {
            eprintln!("usage: fuzz-replay [SECONDS_PER_TARGET] [TARGET...]");
            return ExitCode::from(2);
        }
    };
    let names: Vec<String> = args.collect();
    let mut chosen: Vec<Target> = Vec::new();
    if names.is_empty() {
        chosen.extend(TARGETS);
    }
    for name in &names {
        match target(name) {
            Some(t) => chosen.push(t),
            None => {
                eprintln!("fuzz-replay: no target `{name}`");
                return ExitCode::from(2);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (name, check) in chosen {
        let mut corpus = seeds(name);
        for dir in [
            root.join("fuzz/corpus").join(name),
            root.join("fuzz-targets/regressions").join(name),
        ] {
            corpus.extend(read_dir(&dir));
        }
        match run(name, check, &corpus, Duration::from_secs_f64(seconds)) {
            Ok(executions) => println!(
                "fuzz-replay: {name}: {} inputs replayed, {executions} mutations in {seconds} s, no crash",
                corpus.len()
            ),
            Err(input) => {
                let dir = root.join("fuzz/artifacts").join(name);
                let path = dir.join(format!("crash-{:016x}", fingerprint(&input)));
                let saved = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &input));
                match saved {
                    Ok(()) => eprintln!("fuzz-replay: {name} crashed; input in {}", path.display()),
                    Err(e) => eprintln!("fuzz-replay: {name} crashed; cannot save the input: {e}"),
                }
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// Replays `corpus`, then mutates it until `budget` is spent: the number of mutations
/// run, or the input that panicked.
fn run(name: &str, check: fn(&[u8]), corpus: &[Vec<u8>], budget: Duration) -> Result<u64, Vec<u8>> {
    for input in corpus {
        if catch_unwind(AssertUnwindSafe(|| check(input))).is_err() {
            return Err(input.clone());
        }
    }
    if corpus.is_empty() {
        eprintln!("fuzz-replay: {name} has no inputs to mutate");
        return Ok(0);
    }
    let start = Instant::now();
    let mut rng = Rng::new(start.elapsed().as_nanos() as u64 ^ fingerprint(name.as_bytes()));
    let mut executions = 0u64;
    while start.elapsed() < budget {
        let base = &corpus[rng.below(corpus.len())];
        let other = &corpus[rng.below(corpus.len())];
        let input = mutate(base, other, &mut rng, MAX_LEN);
        if catch_unwind(AssertUnwindSafe(|| check(&input))).is_err() {
            return Err(input);
        }
        executions += 1;
    }
    Ok(executions)
}

/// Every file directly in `dir` (none when it does not exist).
fn read_dir(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect()
}

/// FNV-1a, for artifact names.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
