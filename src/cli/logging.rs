//! `--log-level` and `--log-format`: what the log says and how it is written.
//!
//! The level is a `tracing` filter (`warn`, `info`, `switchyard_engine=debug`);
//! without the flag `RUST_LOG` is read, else `warn`. Text logs are coloured
//! only when stderr is a terminal, so redirected logs hold no ANSI codes;
//! `json` writes one object per line (`timestamp`, `level`, `target`,
//! `message`, the event's fields and those of the spans around it, such as a
//! request's `method`, `path` and `request_id`) for log collectors; what the
//! program prints outside `tracing` follows the same format (`console.rs`).

use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
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

/// Installs the process's log subscriber (`main` tells the console the format too).
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
    match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(filter)
            .with(SpanFields)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .event_format(JsonLines),
            )
            .init(),
    }
    Ok(())
}

/// One JSON log line: `timestamp` (Unix seconds), `level`, `target`, then `fields`.
pub(super) fn json_line(level: &str, target: &str, fields: Map<String, Value>) -> String {
    let mut object = Map::new();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    object.insert("timestamp".into(), Value::from(now));
    object.insert("level".into(), Value::from(level));
    object.insert("target".into(), Value::from(target));
    object.extend(fields);
    Value::Object(object).to_string()
}

/// Keeps each span's fields as JSON in the span's extensions, so that an event
/// inside it (a request's `http` span: method, path, request id) carries them.
struct SpanFields;

impl<S> Layer<S> for SpanFields
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields(Map::new());
        attrs.record(&mut fields);
        span.extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(fields) = extensions.get_mut::<Fields>() {
            values.record(fields);
        }
    }
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
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let metadata = event.metadata();
        // The enclosing spans' fields first (outermost first), the event's own last.
        let mut fields = Fields(Map::new());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(span_fields) = span.extensions().get::<Fields>() {
                    fields.0.extend(span_fields.0.clone());
                }
            }
        }
        event.record(&mut fields);
        let line = json_line(metadata.level().as_str(), metadata.target(), fields.0);
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
