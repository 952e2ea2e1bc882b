//! The embedding of a sequence from its pooled hidden states: the mean over
//! its tokens, scaled to unit length (llama.cpp's server: mean pooling, then
//! `embd_normalize` with the Euclidean norm).

/// `sum / rows` scaled to unit L2 norm (the scale cancels the division, which
/// is kept for clarity); `None` for a zero or non-finite vector.
pub fn unit_mean(sum: &[f64], rows: usize) -> Option<Vec<f32>> {
    let rows = rows.max(1) as f64;
    let mean: Vec<f64> = sum.iter().map(|&total| total / rows).collect();
    let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt();
    if !norm.is_finite() || norm == 0.0 {
        return None;
    }
    Some(mean.iter().map(|&v| (v / norm) as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::unit_mean;

    #[test]
    fn the_mean_is_scaled_to_unit_length() {
        let got = unit_mean(&[6.0, 8.0], 2);
        assert_eq!(got, Some(vec![0.6, 0.8]));
        assert_eq!(unit_mean(&[0.0, 0.0], 3), None);
        assert_eq!(unit_mean(&[f64::NAN, 1.0], 1), None);
    }
}
