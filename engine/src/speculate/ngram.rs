//! Prompt lookup: the tokens that followed the latest earlier occurrence
//! of the sequence's last few tokens.

/// Drafts from n-grams of the sequence's own tokens (prompt and output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ngram {
    /// The shortest suffix that may match. One token matches too often in
    /// free text (every "the") for its guesses to pay for their rows.
    pub min: usize,
    /// The longest suffix tried first: a longer match predicts better.
    pub max: usize,
}

impl Default for Ngram {
    fn default() -> Self {
        Ngram { min: 2, max: 4 }
    }
}

impl Ngram {
    /// Appends to `out` up to `limit` tokens that followed the latest
    /// earlier occurrence of the longest suffix of `tokens` of `max` down
    /// to `min` tokens; nothing when no such suffix occurred before.
    ///
    /// A linear scan per length: a few hundred microseconds at 32k tokens,
    /// against a decode step of milliseconds, and only while drafting.
    pub fn draft(&self, tokens: &[u32], limit: usize, out: &mut Vec<u32>) {
        if limit == 0 {
            return;
        }
        for n in (self.min.max(1)..=self.max).rev() {
            let Some(start) = tokens.len().checked_sub(n) else {
                continue;
            };
            let suffix = &tokens[start..];
            // Latest first: recent text predicts the continuation best.
            let found = (0..start).rev().find(|&i| tokens[i..i + n] == *suffix);
            if let Some(i) = found {
                let from = i + n;
                let to = (from + limit).min(tokens.len());
                out.extend_from_slice(&tokens[from..to]);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(tokens: &[u32], limit: usize) -> Vec<u32> {
        let mut out = Vec::new();
        Ngram::default().draft(tokens, limit, &mut out);
        out
    }

    #[test]
    fn the_continuation_of_an_earlier_occurrence_is_drafted() {
        // "1 2 3 4 5 ... 1 2 3" -> "4 5 9".
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 7, 1, 2, 3], 3), vec![4, 5, 9]);
        // Limited by `limit` and by the end of the text.
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 7, 1, 2, 3], 1), vec![4]);
        assert_eq!(draft(&[7, 1, 2, 8, 1, 2], 5), vec![8, 1, 2]);
    }

    #[test]
    fn the_longest_suffix_wins_over_a_later_shorter_match() {
        // Suffix "1 2 3": the 3-gram at 0 is followed by 4; the later
        // 2-gram "2 3" at 6 by 8.
        let tokens = [1, 2, 3, 4, 0, 0, 2, 3, 8, 1, 2, 3];
        assert_eq!(draft(&tokens, 1), vec![4]);
    }

    #[test]
    fn the_latest_occurrence_of_equal_length_wins() {
        let tokens = [5, 6, 1, 5, 6, 2, 5, 6];
        assert_eq!(draft(&tokens, 1), vec![2]);
    }

    #[test]
    fn no_match_or_too_short_a_suffix_drafts_nothing() {
        assert!(draft(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(draft(&[1], 4).is_empty());
        assert!(draft(&[], 4).is_empty());
        // A single repeated token is below the 2-token minimum...
        assert!(draft(&[9, 4, 1, 9], 4).is_empty());
        // ...but a repeated pair is enough.
        assert_eq!(draft(&[9, 4, 1, 9, 4], 4), vec![1, 9, 4]);
        assert!(draft(&[1, 2, 1, 2], 0).is_empty());
    }
}
