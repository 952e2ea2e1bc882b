//! A tenant's rate limits as the file sets them: requests and tokens per minute.

/// Limits per minute; `None` leaves that kind unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimits {
    /// Requests per minute.
    pub requests_per_minute: Option<u64>,
    /// Tokens per minute: each request counts its prompt estimate plus its
    /// `max_tokens` (or the policy's `assumed_output_tokens`) per generation,
    /// as OpenAI counts them.
    pub tokens_per_minute: Option<u64>,
}

impl RateLimits {
    /// Whether any limit is set.
    pub fn is_set(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some()
    }

    /// `60 requests/min, 40000 tokens/min`, or `none`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = [
            self.requests_per_minute
                .map(|n| format!("{n} requests/min")),
            self.tokens_per_minute.map(|n| format!("{n} tokens/min")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }
}
