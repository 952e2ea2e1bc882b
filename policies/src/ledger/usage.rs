//! One settled request as billing reads it, and its two export formats.

use serde::{Deserialize, Serialize};

/// A settled request: who, what ran, how much, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Unix milliseconds when the request was settled.
    pub time_ms: u64,
    /// The tenant charged (`None`: anonymous).
    pub tenant: Option<String>,
    /// The first 12 hex digits of the API key's SHA-256 (never the key itself).
    pub key_id: Option<String>,
    /// The model that answered.
    pub model: String,
    /// Its version (or adapter).
    pub version: String,
    /// Prompt tokens billed.
    pub tokens_in: u64,
    /// Completion tokens billed.
    pub tokens_out: u64,
    /// Cost in the policy's currency.
    pub cost: f64,
    /// The request's `x-request-id`.
    pub request_id: String,
}

impl UsageRecord {
    /// The CSV header matching [`UsageRecord::csv_row`].
    pub const CSV_HEADER: &'static str =
        "time_ms,tenant,key_id,model,version,tokens_in,tokens_out,cost,request_id";

    /// One CSV line (RFC 4180 quoting where a field needs it), without the newline.
    pub fn csv_row(&self) -> String {
        let fields = [
            self.time_ms.to_string(),
            csv_field(self.tenant.as_deref().unwrap_or("")),
            csv_field(self.key_id.as_deref().unwrap_or("")),
            csv_field(&self.model),
            csv_field(&self.version),
            self.tokens_in.to_string(),
            self.tokens_out.to_string(),
            format!("{:.9}", self.cost),
            csv_field(&self.request_id),
        ];
        fields.join(",")
    }
}

fn csv_field(value: &str) -> String {
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_only_fields_that_need_it() {
        let record = UsageRecord {
            time_ms: 5,
            tenant: Some("a,b".into()),
            key_id: None,
            model: "m".into(),
            version: "v\"1".into(),
            tokens_in: 1,
            tokens_out: 2,
            cost: 0.5,
            request_id: "r".into(),
        };
        assert_eq!(
            record.csv_row(),
            "5,\"a,b\",,m,\"v\"\"1\",1,2,0.500000000,r"
        );
    }
}
