//! `--log-level` and `--log-format`: what the log says and how it is written.
//!
//! The level is a `tracing` filter (`warn`, `info`, `switchyard_engine=debug`);
//! without the flag `RUST_LOG` is read, else `warn`. Text logs are coloured
//! only when stderr is a terminal, so redirected logs hold no ANSI codes;
//! `json` writes one object per line (`timestamp`, `level`, `target`,
//! `message` and the event's fields) for log collectors.

use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging flags every command takes.
#[derive(clap::Args, Debug, Default)]
pub struct LogArgs {
    /// What to log: error, warn, info, debug, trace, or a tracing filter such
    /// as `warn,switchyard_engine=info` [default: $RUST_LOG, else warn].
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// How to write log lines: text or json [default: text].
    #[arg(long, global = true, value_enum, default_value_t)]
    pub log_format: LogFormat,
}

/// Installs the process's log subscriber.
pub fn init(args: &LogArgs) -> anyhow::Result<()> {
    let filter = match &args.log_level {
        Some(level) => EnvFilter::try_new(level).map_err(|e| {
            anyhow::anyhow!(
                "--log-level {level:?} is not a level or filter ({e}); use error, warn, info, \
                 debug or trace"
            )
        })?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.with_ansi(false).event_format(JsonLines).init(),
    }
    Ok(())
}

/// Writes each event as one JSON object.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let metadata = event.metadata();
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let mut object = Map::new();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        object.insert("timestamp".into(), Value::from(now));
        object.insert("level".into(), Value::from(metadata.level().as_str()));
        object.insert("target".into(), Value::from(metadata.target()));
        object.extend(fields.0);
        let line = Value::Object(object).to_string();
        writer.write_str(&line)?;
        writer.write_char('\n')
    }
}

/// An event's fields as JSON values.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::from(format!("{value:?}")));
    }
}
