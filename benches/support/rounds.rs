//! What the benches that measure in interleaved rounds share: the round
//! count from the command line and a median with its range.

/// The first number among the bench's arguments (`cargo bench` passes
/// `--bench` before them), or `default`; at least one round.
pub fn rounds_arg(default: usize) -> usize {
    std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(default)
        .max(1)
}

/// Median, minimum and maximum of `values` (not empty).
pub fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    (median, sorted[0], sorted[n - 1])
}
