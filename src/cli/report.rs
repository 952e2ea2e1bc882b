//! How a failed command's error is printed: each cause once.
//!
//! Contexts often repeat what they wrap (`cannot read P` around an I/O error
//! that names P), and anyhow's default report prints the chain and a
//! backtrace; a user sees `Error: A` with each cause below it only when it
//! adds something.

/// `error` and its causes, one per line, without causes whose text an
/// earlier line already holds.
pub fn error_text(error: &anyhow::Error) -> String {
    let mut lines: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if lines.iter().any(|line| line.contains(text.as_str())) {
            continue;
        }
        lines.push(text);
    }
    let mut out = format!("Error: {}", lines.first().map_or("", String::as_str));
    for cause in lines.iter().skip(1) {
        out.push_str("\n  caused by: ");
        out.push_str(cause);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn a_cause_already_said_is_not_said_again() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let inner = Err::<(), _>(io)
            .context("cannot read /m/a.gguf: No such file")
            .context("cannot load a@1");
        let text = error_text(&inner.unwrap_err());
        assert_eq!(
            text,
            "Error: cannot load a@1\n  caused by: cannot read /m/a.gguf: No such file"
        );
    }
}
