//! One generation as the router asks for it: what to continue and how to pick tokens.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::cache_scope::CacheScope;
use crate::checkpoint_ref::ModelSpec;
use crate::constraint::{Constraint, Tool, ToolCall};
use crate::tenant_share::TenantShare;
use crate::UnsureStop;

/// One generation: a single prompt producing a single completion.
///
/// OpenAI's `n > 1` and multi-prompt completions are fanned out by the router
/// into several `GenerationRequest`s.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// The request id (`x-request-id`), with `/<index>` appended when the
    /// router fans one HTTP request out into several generations.
    pub request_id: String,
    /// The model to run: a name or an alias (its active version), or one checkpoint.
    pub model: ModelSpec,
    /// What to continue.
    pub prompt: Prompt,
    /// Most tokens to generate; `None` means up to the end of the context.
    pub max_tokens: Option<u32>,
    /// How to pick tokens, already range-checked ([`SamplingOptions::check`]).
    pub sampling: SamplingOptions,
    /// Strings that end the generation (at most 4); the engine strips the
    /// matched stop string from the output and reports `FinishReason::Stop`.
    pub stop: Vec<String>,
    /// `None`: no log-probabilities. `Some(k)`: report the sampled token's
    /// log-probability and the `k` most likely alternatives (k <= 20).
    pub logprobs: Option<u8>,
    /// The end user's id, for abuse tracking and logs (OpenAI's `user`).
    pub user: Option<String>,
    /// Functions the model may call; the chat template shows them to the model.
    pub tools: Vec<Tool>,
    /// What the output must look like, enforced token by token; `None`: free text.
    pub constraint: Option<Constraint>,
    /// Whose cached prompt blocks the generation may read and add to
    /// ([`CacheScope`]): set by the router's policy, narrowed by `cache_salt`.
    pub cache_scope: CacheScope,
    /// Whose request it is and its weight, for fair admission when requests queue.
    pub share: TenantShare,
    /// Generations the HTTP request fans out into (`n` × prompts), this one
    /// included: the engine caps the KV cache they reserve together.
    pub fanout: u32,
    /// When the request must be answered by: the router's request deadline, set once
    /// when the request arrives. The engine's scheduler runs a checkpoint sooner as
    /// its requests' deadlines near; `None`: no deadline.
    pub deadline: Option<Instant>,
    /// Stop after the first token when it is too unsure ([`UnsureStop`]): set by the
    /// router on a cascade's first attempt, so that an answer it will defer costs its
    /// prompt and one token. `None`: generate as usual.
    pub stop_unsure: Option<UnsureStop>,
    /// Text the answer already starts with, written by another model (a cascade's
    /// handoff: the weaker model's answer up to its first unsure token): appended to the
    /// prompt as this model reads it (after the chat template's assistant turn opens, or
    /// after a raw prompt's text, tokenized with it), so the generation continues it. It
    /// is not part of the generated output. `None`: the answer starts from scratch.
    pub answer_prefix: Option<String>,
}

impl GenerationRequest {
    /// The request field that holds the prompt, for error messages.
    pub fn prompt_field(&self) -> &'static str {
        self.prompt.field()
    }
}

/// The input of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// A conversation; the engine applies the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Raw text; the engine tokenizes it as is.
    Text(String),
    /// Already tokenized input.
    Tokens(Vec<u32>),
    /// A prompt the backend already templated and tokenized for this model
    /// ([`crate::InferenceBackend::encode_prompt`]), run as is: the router counts
    /// it to reserve a budget, then submits it, so the work is done once.
    Encoded {
        /// The token ids, template applied.
        ids: Vec<u32>,
        /// Whether it came from `messages` (a chat request) rather than `prompt`.
        chat: bool,
    },
}

impl Prompt {
    /// The OpenAI request field that carries this kind of prompt.
    pub fn field(&self) -> &'static str {
        match self {
            Prompt::Chat(_) | Prompt::Encoded { chat: true, .. } => "messages",
            Prompt::Text(_) | Prompt::Tokens(_) | Prompt::Encoded { chat: false, .. } => "prompt",
        }
    }
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: Role,
    /// The text of the turn (OpenAI content parts are concatenated).
    pub content: String,
    /// The calls an assistant turn made.
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` turn: the id of the call it answers.
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A turn of `role` saying `content`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// The speaker of a chat turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Instructions from the deployer.
    System,
    /// OpenAI's newer name for system instructions; templates without a
    /// developer role treat it as `System`.
    Developer,
    /// The end user.
    User,
    /// The model.
    Assistant,
    /// The result of a tool call, answering the assistant turn that made it.
    Tool,
}

impl Role {
    /// The role's name as OpenAI and chat templates spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// The role named `name` as OpenAI spells it.
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "system" => Some(Role::System),
            "developer" => Some(Role::Developer),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" => Some(Role::Tool),
            _ => None,
        }
    }
}

/// Sampling parameters of one generation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SamplingOptions {
    /// In [0, 2]; 0 means greedy. `None`: the engine's default (1.0).
    pub temperature: Option<f32>,
    /// In (0, 1]. `None`: 1.0.
    pub top_p: Option<f32>,
    /// Seed for a reproducible sample; `None`: random.
    pub seed: Option<u64>,
    /// In [-2, 2]; 0 when absent.
    pub presence_penalty: f32,
    /// In [-2, 2]; 0 when absent.
    pub frequency_penalty: f32,
    /// Token id to bias in [-100, 100], added to the logit before sampling.
    pub logit_bias: BTreeMap<u32, f32>,
}

/// Most alternatives per token a request may ask log-probabilities for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u8 = 20;

/// A sampling option outside its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{value} is outside {range}; {advice}.")]
pub struct SamplingRangeError {
    /// The OpenAI field at fault (`logit_bias.<id>` for a bias).
    pub field: String,
    /// The value given.
    pub value: f32,
    /// The allowed range, written as an interval.
    pub range: &'static str,
    /// What to send instead.
    pub advice: &'static str,
}

impl SamplingOptions {
    /// The one check of every range (the engine's sampler relies on it): temperature in
    /// [0, 2], top_p in (0, 1], penalties in [-2, 2], biases in [-100, 100]. NaN is
    /// outside every range.
    pub fn check(&self) -> Result<(), SamplingRangeError> {
        let out = |field: &str, value: f32, range, advice| SamplingRangeError {
            field: field.to_owned(),
            value,
            range,
            advice,
        };
        if let Some(t) = self.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
            return Err(out("temperature", t, "[0, 2]", "use a value from 0 to 2"));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(out(
                "top_p",
                p,
                "(0, 1]",
                "use a value above 0 and at most 1",
            ));
        }
        for (field, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return Err(out(field, value, "[-2, 2]", "use a value from -2 to 2"));
            }
        }
        match self
            .logit_bias
            .iter()
            .find(|(_, bias)| !(-100.0..=100.0).contains(*bias))
        {
            Some((id, &bias)) => Err(out(
                &format!("logit_bias.{id}"),
                bias,
                "[-100, 100]",
                "use a value from -100 to 100",
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_field_and_refuses_nan() {
        assert_eq!(SamplingOptions::default().check(), Ok(()));
        let hot = SamplingOptions {
            temperature: Some(2.5),
            ..SamplingOptions::default()
        };
        let error = hot.check().unwrap_err();
        assert_eq!(
            (error.field.as_str(), error.range),
            ("temperature", "[0, 2]")
        );
        let nan = SamplingOptions {
            presence_penalty: f32::NAN,
            ..SamplingOptions::default()
        };
        assert_eq!(nan.check().unwrap_err().field, "presence_penalty");
        let zero_p = SamplingOptions {
            top_p: Some(0.0),
            ..SamplingOptions::default()
        };
        assert_eq!(zero_p.check().unwrap_err().field, "top_p");
        let bias = SamplingOptions {
            logit_bias: BTreeMap::from([(7, 101.0)]),
            ..SamplingOptions::default()
        };
        assert_eq!(bias.check().unwrap_err().field, "logit_bias.7");
    }

    #[test]
    fn roles_round_trip_through_their_names() {
        for role in [
            Role::System,
            Role::Developer,
            Role::User,
            Role::Assistant,
            Role::Tool,
        ] {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("function"), None);
    }
}
