//! `GET /admin/usage`: the usage ledger for billing, every settled request since a time.
//!
//! `since` is Unix seconds (fractions allowed; default 0: everything kept), `limit` the
//! most records (default and maximum [`MAX_RECORDS`]), `format` `jsonl` (default, one
//! JSON object per line) or `csv` (with a header line). Records come oldest first; to
//! page, ask again with `since` just past the last `time_ms` returned.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use http::header;
use serde::Deserialize;
use switchyard_policies::ledger::UsageRecord;

use crate::admin::{AdminApiError, AdminState};

/// The most records one answer carries.
pub const MAX_RECORDS: usize = 100_000;

/// The query string, as sent.
#[derive(Debug, Deserialize)]
pub(crate) struct UsageQuery {
    since: Option<String>,
    limit: Option<String>,
    format: Option<String>,
}

enum Format {
    JsonLines,
    Csv,
}

pub(crate) async fn export(
    State(state): State<AdminState>,
    Query(query): Query<UsageQuery>,
) -> Response {
    match answer(&state, query).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn answer(state: &AdminState, query: UsageQuery) -> Result<Response, AdminApiError> {
    let since_ms = match query.since.as_deref() {
        None | Some("") => 0,
        Some(text) => match text.trim().parse::<f64>() {
            Ok(secs) if secs.is_finite() && secs >= 0.0 => (secs * 1000.0) as u64,
            _ => {
                return Err(AdminApiError::BadQuery {
                    param: "since",
                    message: format!(
                        "`{text}` is not a time; send Unix seconds such as since=1760000000"
                    ),
                })
            }
        },
    };
    let limit = match query.limit.as_deref() {
        None | Some("") => MAX_RECORDS,
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_RECORDS).contains(&n) => n,
            _ => {
                return Err(AdminApiError::BadQuery {
                    param: "limit",
                    message: format!("`{text}` is not a count from 1 to {MAX_RECORDS}"),
                })
            }
        },
    };
    let format = match query.format.as_deref() {
        None | Some("") | Some("jsonl") | Some("json") => Format::JsonLines,
        Some("csv") => Format::Csv,
        Some(other) => {
            return Err(AdminApiError::BadQuery {
                param: "format",
                message: format!("`{other}` is not a format; use jsonl or csv"),
            })
        }
    };
    let ledger = std::sync::Arc::clone(state.policy()?.current().ledger());
    // Reading the file or asking Redis blocks.
    let records = tokio::task::spawn_blocking(move || ledger.usage_since(since_ms, limit))
        .await
        .map_err(|error| AdminApiError::Task(error.to_string()))?
        .map_err(|error| AdminApiError::Ledger(error.to_string()))?;
    Ok(match format {
        Format::JsonLines => (
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            json_lines(&records),
        )
            .into_response(),
        Format::Csv => ([(header::CONTENT_TYPE, "text/csv")], csv(&records)).into_response(),
    })
}

fn json_lines(records: &[UsageRecord]) -> String {
    let mut out = String::new();
    for record in records {
        // A record of plain strings and numbers always serializes.
        if let Ok(line) = serde_json::to_string(record) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

fn csv(records: &[UsageRecord]) -> String {
    let mut out = String::from(UsageRecord::CSV_HEADER);
    out.push('\n');
    for record in records {
        out.push_str(&record.csv_row());
        out.push('\n');
    }
    out
}
