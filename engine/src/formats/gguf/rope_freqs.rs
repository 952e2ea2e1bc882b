//! Llama 3 rope scaling in GGUF files.
//!
//! llama.cpp's converter does not write Llama 3's scaling parameters as
//! metadata; it writes a `rope_freqs.weight` tensor of per-frequency divisors
//! (`1` for high frequencies, `factor` for low ones, a smooth blend between).
//! [`ModelConfig`](crate::model::config::ModelConfig) describes the scaling
//! by its parameters, so we recover parameters that reproduce the divisors
//! exactly and check that they do.

use crate::model::config::RopeScaling;

/// Relative tolerance when matching divisors (they are stored as f32).
const TOLERANCE: f64 = 1e-4;

/// Finds the Llama 3 scaling that yields `divisors` (one per dimension pair)
/// for a head of `head_dim` with base `theta`. Only the ratios of the
/// parameters to `original_context_length` matter, so any positive value
/// works there; the file's own value is used when it has one.
pub(super) fn llama3_from_divisors(
    divisors: &[f32],
    theta: f32,
    head_dim: usize,
    original_context_length: usize,
) -> Result<RopeScaling, String> {
    if divisors.len() != head_dim / 2 {
        return Err(format!(
            "it has {} entries but head_dim {head_dim} needs {}",
            divisors.len(),
            head_dim / 2
        ));
    }
    if divisors
        .iter()
        .any(|d| !(d.is_finite() && *d >= 1.0 - TOLERANCE as f32))
    {
        return Err("its divisors must be finite numbers of at least 1".into());
    }
    let factor = divisors.iter().copied().fold(1.0f32, f32::max) as f64;
    if factor - 1.0 <= TOLERANCE {
        return Ok(RopeScaling::None);
    }
    let wavelen = |i: usize| {
        let freq = (theta as f64).powf(-2.0 * i as f64 / head_dim as f64);
        2.0 * std::f64::consts::PI / freq
    };
    // Points strictly between "unscaled" and "fully scaled": their blend
    // weight s is linear in 1/wavelength, which pins the two thresholds.
    let blended: Vec<(f64, f64)> = divisors
        .iter()
        .enumerate()
        .filter(|(_, &d)| {
            let d = d as f64;
            (d - 1.0).abs() > TOLERANCE && (d - factor).abs() > TOLERANCE * factor
        })
        .map(|(i, &d)| {
            let s = (1.0 / d as f64 - 1.0 / factor) / (1.0 - 1.0 / factor);
            (1.0 / wavelen(i), s)
        })
        .collect();
    let (Some(&(u1, s1)), Some(&(u2, s2))) = (blended.first(), blended.last()) else {
        return Err("it does not follow Llama 3 scaling (no blended frequencies)".into());
    };
    if blended.len() < 2 || (u1 - u2).abs() < f64::EPSILON {
        return Err("it has too few blended frequencies to recover Llama 3 scaling".into());
    }
    let slope = (s1 - s2) / (u1 - u2);
    let intercept = s1 - slope * u1;
    let old_len = original_context_length as f64;
    if slope <= 0.0 {
        return Err("it does not follow Llama 3 scaling (blend decreases with frequency)".into());
    }
    let low = -intercept * old_len / slope;
    let high = low + old_len / slope;
    if !(low > 0.0 && high > low) {
        return Err("it does not follow Llama 3 scaling (thresholds out of order)".into());
    }
    let scaling = RopeScaling::Llama3 {
        factor: factor as f32,
        low_freq_factor: low as f32,
        high_freq_factor: high as f32,
        original_context_length,
    };
    for (i, &d) in divisors.iter().enumerate() {
        let expected = llama3_divisor(wavelen(i), factor, low, high, old_len);
        if ((d as f64) - expected).abs() > 1e-3 * expected {
            return Err(format!(
                "it does not follow Llama 3 scaling (entry {i} is {d}, Llama 3 would give {expected})"
            ));
        }
    }
    Ok(scaling)
}

/// The divisor Llama 3 scaling applies to a frequency of `wavelen`.
pub(crate) fn llama3_divisor(wavelen: f64, factor: f64, low: f64, high: f64, old_len: f64) -> f64 {
    if wavelen < old_len / high {
        1.0
    } else if wavelen > old_len / low {
        factor
    } else {
        let s = (old_len / wavelen - low) / (high - low);
        1.0 / ((1.0 - s) / factor + s)
    }
}

/// The divisors for given Llama 3 parameters: what a converter writes to
/// `rope_freqs.weight`.
pub fn llama3_rope_divisors(
    theta: f32,
    head_dim: usize,
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    original_context_length: usize,
) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let freq = (theta as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            llama3_divisor(
                wavelen,
                factor as f64,
                low_freq_factor as f64,
                high_freq_factor as f64,
                original_context_length as f64,
            ) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_llama31_parameters() {
        let divisors = llama3_rope_divisors(500_000.0, 128, 8.0, 1.0, 4.0, 8192);
        let scaling = llama3_from_divisors(&divisors, 500_000.0, 128, 8192).unwrap();
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context_length,
        } = scaling
        else {
            panic!("expected llama3 scaling, got {scaling:?}");
        };
        assert_eq!(factor, 8.0);
        assert!((low_freq_factor - 1.0).abs() < 1e-3, "{low_freq_factor}");
        assert!((high_freq_factor - 4.0).abs() < 1e-3, "{high_freq_factor}");
        assert_eq!(original_context_length, 8192);
    }

    #[test]
    fn all_ones_mean_no_scaling() {
        let scaling = llama3_from_divisors(&[1.0; 32], 10_000.0, 64, 4096).unwrap();
        assert_eq!(scaling, RopeScaling::None);
    }

    #[test]
    fn rejects_other_patterns() {
        let mut divisors = llama3_rope_divisors(500_000.0, 64, 4.0, 1.0, 4.0, 64);
        divisors[0] = 3.0;
        assert!(llama3_from_divisors(&divisors, 500_000.0, 64, 64).is_err());
        assert!(llama3_from_divisors(&[2.0; 3], 500_000.0, 64, 64).is_err());
        assert!(llama3_from_divisors(&[f32::NAN; 32], 500_000.0, 64, 64).is_err());
    }
}
