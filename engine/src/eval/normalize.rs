//! How a generated answer is compared with the expected one.
//!
//! The generated text is cut at its first line break (after any leading
//! whitespace), then both texts are normalized: surrounding whitespace
//! trimmed, runs of whitespace made one space, letters lowercased, and one
//! trailing `.` removed. Exact match of the results scores the item.

/// The part of a generated text that is its answer: up to the first line
/// break that follows some text.
pub fn answer_part(generated: &str) -> &str {
    let text = generated.trim_start();
    text.split('\n').next().unwrap_or(text)
}

/// `text` normalized for exact match (see the module documentation).
pub fn normalize(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let lower = joined.to_lowercase();
    match lower.strip_suffix('.') {
        Some(stripped) => stripped.trim_end().to_string(),
        None => lower,
    }
}

/// Whether `generated` answers `expected`.
pub fn matches(generated: &str, expected: &str) -> bool {
    normalize(answer_part(generated)) == normalize(expected)
}

/// Whether generation can stop: the answer's line has ended.
pub fn answer_complete(generated: &str) -> bool {
    generated.trim_start().contains('\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_as_documented() {
        assert!(matches(" 42\nQ: next", "42"));
        assert!(matches("\n\n  Paris.  ", "paris"));
        assert!(matches("New   York", "new york"));
        assert!(!matches("42 apples", "42"));
        assert!(!matches("4\n2", "42"));
        assert!(answer_complete(" 42\n"));
        assert!(!answer_complete("\n 42"));
    }
}
