//! Errors from loading a policy file, each pointing at a line and column.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use serde::Serialize;

/// One problem found in a policy file, with the 1-based line and column where it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// 1-based line of the offending value.
    pub line: usize,
    /// 1-based column (in characters) of the offending value.
    pub column: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Why a policy could not be loaded. The store keeps its current policy on any of these.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read at all.
    #[error("cannot read policy file {}: {source}; check the path and its permissions", path.display())]
    Read {
        /// The path that was tried.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A reload from file was asked of a store that was not opened from a file.
    #[error("this policy store was not loaded from a file, so there is nothing to reload or watch; open it with PolicyStore::open")]
    NoFile,
    /// The watch thread could not be started.
    #[error("cannot start the policy file watcher thread: {source}")]
    Watch {
        /// The spawn error.
        source: std::io::Error,
    },
    /// The file was read but is not a valid policy; every problem found is listed.
    #[error("{}", Problems { source_name, diagnostics })]
    Invalid {
        /// The file path (or `<string>`) the diagnostics refer to.
        source_name: String,
        /// Every problem found, in file order. Never empty.
        diagnostics: Vec<Diagnostic>,
    },
}

impl PolicyError {
    /// The first problem's position, for callers that report only one.
    pub fn first_location(&self) -> Option<(usize, usize)> {
        match self {
            PolicyError::Read { .. } | PolicyError::NoFile | PolicyError::Watch { .. } => None,
            PolicyError::Invalid { diagnostics, .. } => {
                diagnostics.first().map(|d| (d.line, d.column))
            }
        }
    }
}

struct Problems<'a> {
    source_name: &'a str,
    diagnostics: &'a [Diagnostic],
}

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.diagnostics.len();
        let plural = if n == 1 { "" } else { "s" };
        write!(
            f,
            "invalid policy {} ({n} problem{plural})",
            self.source_name
        )?;
        for d in self.diagnostics {
            write!(
                f,
                "\n  {}:{}:{}: {}",
                self.source_name, d.line, d.column, d.message
            )?;
        }
        Ok(())
    }
}

/// Turns a byte offset into a 1-based (line, column) pair, counting columns in characters.
pub(crate) fn line_column(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    // Step back to a char boundary so slicing cannot panic on a mid-character span.
    let mut end = offset;
    while !src.is_char_boundary(end) {
        end -= 1;
    }
    let before = &src[..end];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Collects diagnostics while validating, so one load reports every problem at once.
pub(crate) struct Diagnostics<'a> {
    src: &'a str,
    list: Vec<Diagnostic>,
}

impl<'a> Diagnostics<'a> {
    pub(crate) fn new(src: &'a str) -> Self {
        Diagnostics {
            src,
            list: Vec::new(),
        }
    }

    /// Records a problem at the start of `span`.
    pub(crate) fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = line_column(self.src, span.start);
        self.list.push(Diagnostic {
            line,
            column,
            message: message.into(),
        });
    }

    /// The 1-based line where `span` starts (for "first defined at line N").
    pub(crate) fn line_of(&self, span: &Range<usize>) -> usize {
        line_column(self.src, span.start).0
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(crate) fn into_error(mut self, source_name: &str) -> PolicyError {
        self.list.sort_by_key(|d| (d.line, d.column));
        PolicyError::Invalid {
            source_name: source_name.to_string(),
            diagnostics: self.list,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_column_counts_from_one() {
        let src = "a = 1\nbb = 2\n";
        assert_eq!(line_column(src, 0), (1, 1));
        assert_eq!(line_column(src, 6), (2, 1));
        assert_eq!(line_column(src, 11), (2, 6));
        assert_eq!(line_column(src, 999), (3, 1));
    }

    #[test]
    fn line_column_survives_multibyte_offsets() {
        let src = "é = 1";
        assert_eq!(line_column(src, 1), (1, 1));
        assert_eq!(line_column(src, 2), (1, 2));
    }
}
