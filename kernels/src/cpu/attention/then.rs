//! The weights a decode step's attention asks for while it folds: what
//! the caller multiplies next (`prefetch::Upcoming`), spread over the key
//! blocks each thread is expected to fold.

use super::split::Task;
use crate::cpu::kv_layout::KEY_BLOCK;
use crate::cpu::prefetch::{Share, Upcoming};

/// The most lines one folded key block asks for: a key block of SmolLM2's
/// (three heads of 64) is 128 lines of keys and values.
const CAP: usize = 64;

/// An [`Upcoming`] over `parts` for a call whose tasks are `tasks`, or
/// `None` where nothing is asked for: no weights, or a call with a prompt
/// (whose products are bound by their arithmetic, not their reads).
pub(super) fn upcoming<'a>(
    parts: &'a [&'a [u8]],
    decode: bool,
    tasks: &[Task],
    threads: usize,
    window: Option<usize>,
) -> Option<Upcoming<'a>> {
    let mode = mode();
    if parts.is_empty() || !decode || mode == 0 {
        return None;
    }
    let first_seen = |p: usize| window.map_or(0, |w| (p + 1).saturating_sub(w));
    let blocks: usize = tasks
        .iter()
        .map(|t| {
            let u = &t.unit;
            let start = (t.segments.start * u.segment).max(first_seen(u.first_pos));
            let end = (t.segments.end * u.segment).min(u.first_pos + u.rows.len());
            end.div_ceil(KEY_BLOCK).saturating_sub(start / KEY_BLOCK)
        })
        .sum();
    let threads = threads.max(1);
    let share = if mode == 1 { Share::All } else { Share::Halves };
    let parts = &parts[..parts.len().min(knob_parts())];
    Some(Upcoming::new(parts, threads, blocks.div_ceil(threads), knob_cap(), share))
}

fn mode() -> usize {
    static M: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    crate::cpu::knob::usize_or(&M, "SWITCHYARD_THEN_MODE", 2, |_| true)
}
fn knob_cap() -> usize {
    static M: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    crate::cpu::knob::usize_or(&M, "SWITCHYARD_THEN_CAP", CAP, |_| true)
}
fn knob_parts() -> usize {
    static M: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    crate::cpu::knob::usize_or(&M, "SWITCHYARD_THEN_PARTS", 8, |_| true)
}

// MEASUREMENT ONLY (not for commit): SWITCHYARD_THEN_FLIP=K switches the
// prefetch on and off every K decode steps and prints each setting's
// median step time.
pub(super) fn flip_on(layer: usize, decode: bool) -> bool {
    use std::sync::Mutex;
    static K: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let k = crate::cpu::knob::usize_or(&K, "SWITCHYARD_THEN_FLIP", 0, |_| true);
    if k == 0 {
        return true;
    }
    #[allow(clippy::type_complexity)]
    static ST: Mutex<(usize, Option<std::time::Instant>, Vec<f64>, Vec<f64>)> =
        Mutex::new((0, None, Vec::new(), Vec::new()));
    let mut st = ST.lock().expect("flip");
    if decode && layer == 0 {
        let now = std::time::Instant::now();
        let on = (st.0 / k).is_multiple_of(2);
        if let Some(last) = st.1 {
            let d = now.duration_since(last).as_secs_f64() * 1e6;
            if on {
                st.2.push(d);
            } else {
                st.3.push(d);
            }
        }
        st.1 = Some(now);
        st.0 += 1;
        if st.0.is_multiple_of(128) {
            let med = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).copied().unwrap_or(0.0)
            };
            let (mut a, mut b) = (st.2.clone(), st.3.clone());
            eprintln!(
                "FLIP steps {} on {:.1} us ({}) off {:.1} us ({}) ratio off/on {:.3}",
                st.0,
                med(&mut a),
                a.len(),
                med(&mut b),
                b.len(),
                med(&mut b) / med(&mut a)
            );
        }
    }
    (st.0 / k).is_multiple_of(2)
}
