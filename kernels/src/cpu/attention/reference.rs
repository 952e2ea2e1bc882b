//! The straightforward scalar attention of one query row and head, kept as the
//! reference the streaming kernel (`stream`) is tested against: a full row
//! of scores, a softmax with the maximum subtracted first, then the
//! weighted sum of the values.

/// One query against `keys`/`values` (`seen × head_dim` each): `out` is the
/// softmax(`scale · q·k`)-weighted sum of the values.
pub(crate) fn attend_one(query: &[f32], keys: &[f32], values: &[f32], scale: f32, out: &mut [f32]) {
    let head_dim = query.len();
    let mut scores: Vec<f32> = keys
        .chunks_exact(head_dim)
        .map(|k| scale * query.iter().zip(k).map(|(q, k)| q * k).sum::<f32>())
        .collect();
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
    let mut total = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        total += *s;
    }
    out.fill(0.0);
    for (weight, value) in scores.iter().zip(values.chunks_exact(head_dim)) {
        for (o, v) in out.iter_mut().zip(value) {
            *o += weight * v;
        }
    }
    let norm = 1.0 / total;
    out.iter_mut().for_each(|o| *o *= norm);
}
