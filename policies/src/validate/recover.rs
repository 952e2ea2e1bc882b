//! Parsing a policy file past its first TOML error.
//!
//! `toml` stops at the first unknown key or bad value, so a file with typos on
//! lines 7 and 23 reported one of them. Here each error is recorded, the line
//! it points at is blanked (every byte a space, so later offsets, lines and
//! columns stay those of the real file) and the text parsed again, until it
//! parses or an error repeats. A blanked table header blanks its whole table
//! (its keys would otherwise land in the table before it and be reported
//! again as unknown there).

use std::ops::Range;

use crate::error::Diagnostics;
use crate::schema::PolicyFile;

/// Most errors recovered from; past it the rest are not worth the noise.
const MAX_ERRORS: usize = 50;

/// The file as far as it could be parsed, every TOML error recorded in `diags`;
/// `None` when it could not be recovered (a syntax error that blanking a line
/// does not fix).
pub(super) fn parse(src: &str, diags: &mut Diagnostics<'_>) -> Option<PolicyFile> {
    let mut text = src.as_bytes().to_vec();
    let mut blanked: Vec<String> = Vec::new();
    let mut seen: Vec<usize> = Vec::new();
    loop {
        // Blanking only writes ASCII spaces over whole lines, so the text stays UTF-8.
        let current = String::from_utf8_lossy(&text).into_owned();
        let error = match toml::from_str::<PolicyFile>(&current) {
            Ok(file) => return Some(file),
            Err(error) => error,
        };
        let span = error.span().unwrap_or(0..0);
        let message = error.message().trim().to_string();
        // A blanked required key shows up again as missing: that is the same problem.
        let echo = blanked
            .iter()
            .any(|key| message == format!("missing field `{key}`"));
        if !echo {
            diags.at(span.clone(), message);
        }
        let line = line_range(&text, span.start);
        if seen.contains(&line.start) || seen.len() >= MAX_ERRORS {
            return None;
        }
        seen.push(line.start);
        if let Some(key) = key_of(&text[line.clone()]) {
            blanked.push(key);
        }
        let range = if is_header(&text[line.clone()]) {
            line.start..table_end(&text, line.end)
        } else {
            line
        };
        for byte in &mut text[range] {
            if *byte != b'\n' && *byte != b'\r' {
                *byte = b' ';
            }
        }
    }
}

/// The byte range of the line holding `offset` (without its newline).
fn line_range(text: &[u8], offset: usize) -> Range<usize> {
    let offset = offset.min(text.len());
    let start = text[..offset]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let end = text[offset..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(text.len(), |i| offset + i);
    start..end
}

fn is_header(line: &[u8]) -> bool {
    line.trim_ascii_start().starts_with(b"[")
}

/// Where the table whose header ends at `from` ends: the next header's line.
fn table_end(text: &[u8], from: usize) -> usize {
    let mut start = from;
    while start < text.len() {
        let line = line_range(text, start + 1);
        if is_header(&text[line.clone()]) {
            return line.start;
        }
        start = line.end;
    }
    text.len()
}

/// The key a `key = value` line sets.
fn key_of(line: &[u8]) -> Option<String> {
    let line = std::str::from_utf8(line).ok()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty()).then(|| key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(src: &str) -> Vec<(usize, String)> {
        let mut diags = Diagnostics::new(src);
        parse(src, &mut diags);
        match diags.into_error("p.toml") {
            crate::PolicyError::Invalid { diagnostics, .. } => diagnostics
                .into_iter()
                .map(|d| (d.line, d.message))
                .collect(),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn every_unknown_key_is_reported_at_its_line() {
        let src = "[routing]\nquality_weight = 1.0\ncots_weight = 1.0\n\n[[models]]\nname = \"a\"\nversion = \"1\"\nqualty = 0.5\n";
        let found = problems(src);
        let lines: Vec<usize> = found.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, vec![3, 8], "{found:?}");
        assert!(found[0].1.contains("cots_weight"), "{found:?}");
        assert!(found[1].1.contains("qualty"), "{found:?}");
    }

    #[test]
    fn a_misspelled_table_is_reported_once() {
        let src = "[[modles]]\nname = \"a\"\nversion = \"1\"\n[routing]\ncots = 1\n";
        let found = problems(src);
        let lines: Vec<usize> = found.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, vec![1, 5], "{found:?}");
    }
}
