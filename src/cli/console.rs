//! What the program tells its operator outside `tracing`: startup lines (models
//! loaded, where it listens, which ledger), problems, `stopped`, the error it exits
//! with, a panic. They are always shown, whatever `--log-level`, and written in the
//! log's format: as text lines (unchanged), or with `--log-format json` as one JSON
//! object per line with the same keys as the `tracing` events (`timestamp`, `level`,
//! `target`, `message`), so that a log collector reads every line of stderr.

use std::sync::OnceLock;

use serde_json::{Map, Value};

use super::logging::{json_line, LogFormat};

/// The format chosen at startup (`logging::init`); text until then.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Sets the format every later line is written in, and in JSON has panics
/// written as JSON lines too.
pub fn set_format(format: LogFormat) {
    if FORMAT.set(format).is_err() || format != LogFormat::Json {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned();
        write(
            "ERROR",
            &format!("thread `{thread}` panicked{location}: {payload}"),
        );
    }));
}

/// An informational line (`switchyard: loaded ...`).
pub fn info(message: &str) {
    write("INFO", message);
}

/// A warning (starting degraded, a problem skipped).
pub fn warn(message: &str) {
    write("WARN", message);
}

/// The error the program exits with.
pub fn error(message: &str) {
    write("ERROR", message);
}

fn write(level: &str, message: &str) {
    match FORMAT.get().copied().unwrap_or_default() {
        LogFormat::Text => eprintln!("{message}"),
        LogFormat::Json => {
            let mut fields = Map::new();
            // The text's `switchyard: ` prefix names the target, which has its own key.
            let message = message.strip_prefix("switchyard: ").unwrap_or(message);
            fields.insert("message".into(), Value::from(message));
            eprintln!("{}", json_line(level, "switchyard", fields));
        }
    }
}
