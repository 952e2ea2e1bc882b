//! Measuring knobs: a kernel's tuning constant that a benchmark may
//! override from the environment, to compare settings with one build.

use std::sync::OnceLock;

/// `name`'s value from the environment where it parses and `valid`
/// accepts it, else `default`. Read once into `cell`: knobs are asked on
/// every kernel call.
pub(crate) fn usize_or(
    cell: &'static OnceLock<usize>,
    name: &str,
    default: usize,
    valid: impl Fn(usize) -> bool,
) -> usize {
    *cell.get_or_init(|| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|&v| valid(v))
            .unwrap_or(default)
    })
}
