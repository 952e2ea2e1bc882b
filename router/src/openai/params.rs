//! Parsing of the parameters chat and completions share: sampling, stop,
//! `n`, `max_tokens`, logprobs, streaming. Each check names the field, the
//! allowed range and the value given.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::ApiError;
use crate::openai::types::SharedFields;
use switchyard_seam::{
    CacheScope, Constraint, GenerationRequest, ModelSpec, Prompt, SamplingOptions, TenantShare,
    Tool, MAX_TOP_LOGPROBS,
};

/// Most stop strings OpenAI accepts.
pub const MAX_STOP_STRINGS: usize = 4;
/// Longest stop string accepted, in characters: the engine holds back output while
/// it might be the start of a stop string, and checks every one at every token.
pub const MAX_STOP_CHARS: usize = 256;
/// Longest `user` accepted, in characters (it keys split stickiness and logs).
pub const MAX_USER_CHARS: usize = 256;
/// Longest `cache_salt` accepted, in characters.
pub const MAX_CACHE_SALT_CHARS: usize = 256;
/// Most tokens one `logit_bias` may name.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Largest `n` accepted.
pub const MAX_N: i64 = 16;

/// Validated generation parameters, shared by every choice of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationParams {
    /// Most tokens per choice; `None`: up to the end of the context.
    pub max_tokens: Option<u32>,
    /// Sampling options (the seed is per request; choice `i` uses seed + i).
    pub sampling: SamplingOptions,
    /// Stop strings.
    pub stop: Vec<String>,
    /// `Some(k)`: log-probabilities with `k` alternatives.
    pub logprobs: Option<u8>,
    /// End-user id.
    pub user: Option<String>,
    /// vLLM's `cache_salt`: narrows the prompt-cache scope the policy gives.
    pub cache_salt: Option<String>,
    /// Choices per prompt, in [1, 16].
    pub n: u32,
    /// Functions the model may call (chat only).
    pub tools: Vec<Tool>,
    /// What the output must look like (`response_format`, forced tool calls).
    pub constraint: Option<Constraint>,
}

/// Whole JSON or SSE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseMode {
    /// One JSON body when generation is done.
    Whole,
    /// SSE chunks as tokens arrive.
    Stream {
        /// Send a last chunk with the usage of the whole request.
        include_usage: bool,
    },
}

impl SharedFields {
    /// Checks every field but `model` and `response_format` (the endpoint reads
    /// those, in its own order of checks) and returns the parameters and the
    /// response mode. `max_tokens_field` names the field `max_tokens` came from
    /// (chat's `max_completion_tokens` replaces it); `logprobs` is the endpoint's,
    /// already parsed (its shape differs between chat and completions).
    pub fn parse(
        self,
        max_tokens_field: &str,
        logprobs: Option<u8>,
    ) -> Result<(GenerationParams, ResponseMode), ApiError> {
        let max_tokens = match self.max_tokens {
            None => None,
            Some(value) if value < 1 => {
                return Err(invalid(
                    max_tokens_field,
                    format!("{value} is below the minimum 1; ask for at least one token."),
                ))
            }
            Some(value) => Some(u32::try_from(value).map_err(|_| {
                invalid(
                    max_tokens_field,
                    format!("{value} is above the maximum {}.", u32::MAX),
                )
            })?),
        };
        // Ranges by the seam's one rule (`SamplingOptions::check`), which the engine
        // trusts.
        let sampling = SamplingOptions {
            temperature: self.temperature.map(|t| t as f32),
            top_p: self.top_p.map(|p| p as f32),
            // Negative seeds are valid JSON integers; keep their bits.
            seed: self.seed.map(|seed| seed as u64),
            presence_penalty: self.presence_penalty.unwrap_or(0.0) as f32,
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0) as f32,
            logit_bias: parse_logit_bias(self.logit_bias)?,
        };
        sampling
            .check()
            .map_err(|error| invalid(&error.field, error.to_string()))?;
        let n = match self.n {
            None => 1,
            Some(value) if !(1..=MAX_N).contains(&value) => {
                return Err(invalid(
                    "n",
                    format!(
                        "{value} is outside [1, {MAX_N}]; ask for between 1 and {MAX_N} choices."
                    ),
                ))
            }
            Some(value) => u32::try_from(value).unwrap_or(1),
        };
        let mode = match (self.stream.unwrap_or(false), self.stream_options) {
            (true, options) => ResponseMode::Stream {
                include_usage: options.and_then(|o| o.include_usage).unwrap_or(false),
            },
            (false, Some(_)) => {
                return Err(invalid(
                    "stream_options",
                    "stream_options is only allowed when stream is true; set stream to true or drop stream_options.".to_owned(),
                ))
            }
            (false, None) => ResponseMode::Whole,
        };
        let params = GenerationParams {
            max_tokens,
            sampling,
            stop: parse_stop(self.stop)?,
            logprobs,
            user: parse_user(self.user)?,
            cache_salt: parse_cache_salt(self.cache_salt)?,
            n,
            tools: Vec::new(),
            constraint: None,
        };
        Ok((params, mode))
    }
}

impl GenerationParams {
    /// One generation request per (prompt, choice), in OpenAI's choice order:
    /// index = prompt_index × n + choice. Choice `i` gets seed + i so that
    /// choices differ yet stay reproducible. Each reads the prompt cache of
    /// `scope` (the policy's), narrowed by the request's `cache_salt`.
    pub fn requests(
        &self,
        request_id: &str,
        model: &ModelSpec,
        scope: &CacheScope,
        prompts: Vec<Prompt>,
    ) -> Vec<GenerationRequest> {
        let cache_scope = scope.clone().with_salt(self.cache_salt.as_deref());
        let total = prompts.len() * self.n as usize;
        let mut requests = Vec::with_capacity(total);
        for prompt in prompts {
            for choice in 0..self.n {
                let index = requests.len();
                let mut sampling = self.sampling.clone();
                sampling.seed = sampling
                    .seed
                    .map(|seed| seed.wrapping_add(u64::from(choice)));
                requests.push(GenerationRequest {
                    request_id: if total == 1 {
                        request_id.to_owned()
                    } else {
                        format!("{request_id}/{index}")
                    },
                    model: model.clone(),
                    prompt: prompt.clone(),
                    max_tokens: self.max_tokens,
                    sampling,
                    stop: self.stop.clone(),
                    logprobs: self.logprobs,
                    user: self.user.clone(),
                    tools: self.tools.clone(),
                    constraint: self.constraint.clone(),
                    cache_scope: cache_scope.clone(),
                    share: TenantShare::default(),
                    fanout: u32::try_from(total).unwrap_or(u32::MAX),
                    deadline: None,
                    stop_unsure: None,
                    answer_prefix: None,
                });
            }
        }
        requests
    }
}

/// The one check of fan-out: refuses a request that would fan out into more than `max_fanout` generations
/// (`prompts` × `n`), before any of them is built: a 4 MB body can name a million
/// prompts, and building prompts × n copies first would cost gigabytes.
pub fn check_fanout(prompts: usize, n: Option<i64>, max_fanout: u32) -> Result<(), ApiError> {
    // An `n` out of range is the validator's to report, with its own message.
    let n = n.filter(|n| (1..=MAX_N).contains(n)).unwrap_or(1);
    let total = prompts.saturating_mul(usize::try_from(n).unwrap_or(1));
    if total > max_fanout as usize {
        return Err(fanout_error(total, max_fanout));
    }
    Ok(())
}

fn fanout_error(total: usize, max_fanout: u32) -> ApiError {
    ApiError::InvalidValue {
        param: "n".to_owned(),
        message: format!(
            "the request asks for {total} generations (n x prompts); this server allows at most {max_fanout} per request."
        ),
    }
}

/// An `InvalidValue` error for `param`.
pub fn invalid(param: &str, message: String) -> ApiError {
    ApiError::InvalidValue {
        param: param.to_owned(),
        message,
    }
}

/// The `model` field, required and non-empty.
pub fn parse_model(model: Option<String>) -> Result<String, ApiError> {
    match model {
        None => Err(ApiError::MissingParameter {
            param: "model".to_owned(),
        }),
        Some(model) if model.trim().is_empty() => Err(invalid(
            "model",
            "the model name is empty; GET /v1/models lists the models served here.".to_owned(),
        )),
        Some(model) => Ok(model),
    }
}

/// A top-logprobs count in [0, 20] for `param`.
pub fn parse_top_logprobs(param: &str, value: i64) -> Result<u8, ApiError> {
    if (0..=i64::from(MAX_TOP_LOGPROBS)).contains(&value) {
        u8::try_from(value).map_err(|_| invalid(param, format!("{value} is not a count.")))
    } else {
        Err(invalid(
            param,
            format!("{value} is outside [0, {MAX_TOP_LOGPROBS}]; ask for at most {MAX_TOP_LOGPROBS} alternatives."),
        ))
    }
}

/// Short description of a JSON value for error messages.
pub fn describe(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        let head: String = text.chars().take(57).collect();
        format!("{head}...")
    } else {
        text
    }
}

fn parse_stop(stop: Option<Value>) -> Result<Vec<String>, ApiError> {
    let strings = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(text)) => vec![text],
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text),
                other => Err(ApiError::InvalidType {
                    param: format!("stop[{i}]"),
                    detail: format!("expected a string, found {}", describe(&other)),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(ApiError::InvalidType {
                param: "stop".to_owned(),
                detail: format!(
                    "expected a string or an array of strings, found {}",
                    describe(&other)
                ),
            })
        }
    };
    if strings.len() > MAX_STOP_STRINGS {
        return Err(invalid(
            "stop",
            format!(
                "{} stop strings were given; at most {MAX_STOP_STRINGS} are allowed.",
                strings.len()
            ),
        ));
    }
    if let Some(i) = strings.iter().position(String::is_empty) {
        return Err(invalid(
            &format!("stop[{i}]"),
            "the stop string is empty; remove it.".to_owned(),
        ));
    }
    if let Some(i) = strings
        .iter()
        .position(|s| s.chars().count() > MAX_STOP_CHARS)
    {
        return Err(invalid(
            &format!("stop[{i}]"),
            format!(
                "the stop string has {} characters; at most {MAX_STOP_CHARS} are allowed.",
                strings[i].chars().count()
            ),
        ));
    }
    Ok(strings)
}

fn parse_user(user: Option<String>) -> Result<Option<String>, ApiError> {
    match user {
        Some(user) if user.chars().count() > MAX_USER_CHARS => Err(invalid(
            "user",
            format!(
                "the user id has {} characters; at most {MAX_USER_CHARS} are allowed.",
                user.chars().count()
            ),
        )),
        other => Ok(other),
    }
}

/// A salt is a string of 1 to [`MAX_CACHE_SALT_CHARS`] characters.
fn parse_cache_salt(salt: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(salt) = salt else { return Ok(None) };
    let chars = salt.chars().count();
    if chars == 0 || chars > MAX_CACHE_SALT_CHARS {
        return Err(invalid(
            "cache_salt",
            format!("the salt has {chars} characters; send between 1 and {MAX_CACHE_SALT_CHARS}, or leave cache_salt out."),
        ));
    }
    Ok(Some(salt))
}

fn parse_logit_bias(bias: Option<BTreeMap<String, f64>>) -> Result<BTreeMap<u32, f32>, ApiError> {
    let count = bias.as_ref().map_or(0, BTreeMap::len);
    if count > MAX_LOGIT_BIAS {
        return Err(invalid(
            "logit_bias",
            format!("{count} tokens are biased; at most {MAX_LOGIT_BIAS} are allowed."),
        ));
    }
    let mut parsed = BTreeMap::new();
    for (token, value) in bias.unwrap_or_default() {
        let id = token.parse::<u32>().map_err(|_| {
            invalid(
                "logit_bias",
                format!("the key \"{token}\" is not a token id; keys must be token ids such as \"50256\"."),
            )
        })?;
        parsed.insert(id, value as f32);
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(fields: SharedFields) -> (Option<String>, String) {
        let error = fields.parse("max_tokens", None).unwrap_err();
        (error.param(), error.to_string())
    }

    /// The ranges are the seam's (`SamplingOptions::check`), with the messages clients
    /// have always read.
    #[test]
    fn sampling_ranges_are_the_seams_with_the_same_messages() {
        let (param, message) = refusal(SharedFields {
            temperature: Some(2.5),
            ..SharedFields::default()
        });
        assert_eq!(param.as_deref(), Some("temperature"));
        assert!(
            message.contains("2.5 is outside [0, 2]; use a value from 0 to 2."),
            "{message}"
        );
        let (param, message) = refusal(SharedFields {
            top_p: Some(0.0),
            ..SharedFields::default()
        });
        assert_eq!(param.as_deref(), Some("top_p"));
        assert!(
            message.contains("use a value above 0 and at most 1"),
            "{message}"
        );
        let (param, _) = refusal(SharedFields {
            logit_bias: Some(BTreeMap::from([("7".to_owned(), 101.0)])),
            ..SharedFields::default()
        });
        assert_eq!(param.as_deref(), Some("logit_bias.7"));
    }

    #[test]
    fn fan_out_is_checked_once_before_anything_is_built() {
        assert!(check_fanout(4, Some(16), 64).is_ok());
        let error = check_fanout(5, Some(16), 64).unwrap_err();
        assert_eq!(error.param().as_deref(), Some("n"));
    }
}
