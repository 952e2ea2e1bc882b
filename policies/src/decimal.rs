//! Numbers with a fixed count of decimals for headers and explanations, without the
//! float formatting machinery: `format!("{:.4}", x)` costs about a thousand
//! instructions a number, a fifth of a whole routing decision.

use std::fmt::Write as _;

/// The largest scaled magnitude written through integers; beyond it (and for NaN and
/// infinities) the standard formatter takes over.
const INTEGER_LIMIT: f64 = 1e15;

/// Appends `x` with `decimals` digits after the point (at most 9), rounded half away
/// from zero on `x × 10^decimals`. Where that product is inexact the last digit can
/// differ by one from `format!("{x:.decimals$}")`, which rounds the exact binary value.
/// Values that round to zero print without a sign.
pub fn push_fixed(out: &mut String, x: f64, decimals: u32) {
    let decimals = decimals.min(9);
    let unit = 10u64.pow(decimals);
    let scaled = (x.abs() * unit as f64).round();
    if scaled.is_nan() || scaled >= INTEGER_LIMIT {
        let _ = write!(out, "{x:.*}", decimals as usize);
        return;
    }
    // In range and non-negative: the cast is exact.
    let scaled = scaled as u64;
    if x < 0.0 && scaled != 0 {
        out.push('-');
    }
    push_digits(out, scaled / unit, 1);
    if decimals > 0 {
        out.push('.');
        push_digits(out, scaled % unit, decimals as usize);
    }
}

/// Appends `n` in decimal, zero-padded to at least `width` digits.
pub fn push_digits(out: &mut String, mut n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut at = digits.len();
    while n > 0 || digits.len() - at < width.min(digits.len()) {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if at == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// [`push_fixed`] into a new string.
pub fn fixed(x: f64, decimals: u32) -> String {
    let mut out = String::with_capacity(24);
    push_fixed(&mut out, x, decimals);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn writes_fixed_decimals() {
        assert_eq!(fixed(0.5, 4), "0.5000");
        assert_eq!(fixed(-1.25, 1), "-1.3");
        assert_eq!(fixed(-0.00001, 4), "0.0000");
        assert_eq!(fixed(1234.5, 0), "1235");
        assert_eq!(fixed(0.000123, 6), "0.000123");
        assert_eq!(fixed(f64::INFINITY, 3), "inf");
        assert_eq!(fixed(f64::NEG_INFINITY, 0), "-inf");
        assert_eq!(fixed(f64::NAN, 2), "NaN");
        assert_eq!(fixed(3e20, 2), format!("{:.2}", 3e20));
        let mut s = String::new();
        push_digits(&mut s, 0, 1);
        push_digits(&mut s, 7, 3);
        push_digits(&mut s, u64::MAX, 1);
        assert_eq!(s, format!("0007{}", u64::MAX));
    }

    proptest! {
        /// Within one unit of the last decimal of the standard formatter, and equal to it
        /// whenever the scaled value is not within a hair of a rounding tie.
        #[test]
        fn agrees_with_the_standard_formatter(x in -1e6f64..1e6, decimals in 0u32..=6) {
            let ours: f64 = fixed(x, decimals).parse().unwrap();
            let std: f64 = format!("{x:.*}", decimals as usize).parse().unwrap();
            let unit = 10f64.powi(-(decimals as i32));
            // One unit of the last decimal, plus the rounding of parsing both strings
            // back (a few ulps of x: at 3.5e5 an ulp is 6e-11, 6e-5 of a 1e-6 unit).
            let parse_slack = 4.0 * f64::EPSILON * x.abs().max(1.0);
            prop_assert!((ours - std).abs() <= unit + parse_slack, "{x}: {ours} vs {std}");
            let frac = (x.abs() * 10f64.powi(decimals as i32)).fract();
            if (frac - 0.5).abs() > 1e-6 {
                let mut expected = format!("{x:.*}", decimals as usize);
                // The standard formatter keeps the sign of a value rounded to zero.
                if expected.starts_with('-') && expected[1..].bytes().all(|b| b == b'0' || b == b'.') {
                    expected.remove(0);
                }
                prop_assert_eq!(fixed(x, decimals), expected);
            }
        }
    }
}
