//! Parsing a policy file past its first TOML error.
//!
//! `toml` stops at the first unknown key or bad value, so a file with typos on
//! lines 7 and 23 reported one of them. Here each error is recorded, the line
//! it points at is blanked (every byte a space, so later offsets, lines and
//! columns stay those of the real file) and the text parsed again, until it
//! parses or an error repeats. A blanked table header blanks its whole table
//! (its keys would otherwise land in the table before it and be reported
//! again as unknown there), and the file's meaning is then not checked: what
//! the table defined is gone. A key missing from a table with a blanked line
//! is that line's typo again and is not reported twice.

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
    // Where blanked lines started.
    let mut blanked: Vec<usize> = Vec::new();
    // Whether a whole table was blanked: the rest of the file then lacks what it
    // defined, and checking its meaning would report that absence again.
    let mut lost_a_table = false;
    loop {
        // Blanking only writes ASCII spaces over whole lines, so the text stays UTF-8.
        let current = String::from_utf8_lossy(&text).into_owned();
        let error = match toml::from_str::<PolicyFile>(&current) {
            Ok(file) => return (!lost_a_table).then_some(file),
            Err(error) => error,
        };
        let span = error.span().unwrap_or(0..0);
        let message = error.message().trim().to_string();
        let line = line_range(&text, span.start);
        let range = if is_header(&text[line.clone()]) {
            lost_a_table = true;
            line.start..table_end(&text, line.end)
        } else {
            line.clone()
        };
        // A key missing from a table one of whose lines was blanked (a misspelt
        // `qualty` for `quality`) is that typo again.
        let echo = message.starts_with("missing field")
            && blanked.iter().any(|start| range.contains(start));
        if !echo {
            diags.at(span, message);
        }
        if blanked.contains(&line.start) || blanked.len() >= MAX_ERRORS {
            return None;
        }
        blanked.push(line.start);
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
    fn a_misspelt_required_key_is_not_also_reported_missing() {
        let src = "[routing]\ncots_weight = 1.0\n\n[[models]]\nname = \"a\"\nversion = \"1\"\nqualty = 0.5\n";
        let found = problems(src);
        let lines: Vec<usize> = found.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, vec![2, 7], "{found:?}");
    }

    #[test]
    fn a_missing_key_is_reported() {
        let src = "[[models]]\nname = \"a\"\nversion = \"1\"\n";
        let found = problems(src);
        assert!(
            found
                .iter()
                .any(|(line, m)| *line == 1 && m.contains("missing field")),
            "{found:?}"
        );
    }

    #[test]
    fn a_misspelled_table_is_reported_once() {
        let src = "[[modles]]\nname = \"a\"\nversion = \"1\"\n[routing]\ncots = 1\n";
        let found = problems(src);
        let lines: Vec<usize> = found.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, vec![1, 5], "{found:?}");
    }
}
