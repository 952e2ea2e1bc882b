//! Sampling parameters and their validation.

/// How to pick the next token. `Default` is greedy decoding.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0` picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability adds up
    /// to at least `top_p`; `1` keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `0` keeps all.
    pub min_p: f32,
    /// Seen tokens' positive logits are divided by it, negative ones
    /// multiplied (CTRL / llama.cpp); `1` is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every seen token (OpenAI); `0` is off.
    pub presence_penalty: f32,
    /// Subtracted from a seen token's logit once per occurrence (OpenAI); `0` is off.
    pub frequency_penalty: f32,
    /// Seed for reproducible sampling; `None` seeds from the OS.
    pub seed: Option<u64>,
    /// Added to the logits of the given token ids before anything else.
    pub logit_bias: Vec<(u32, f32)>,
    /// How many most likely alternatives to report with each token; `0` for none.
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
            top_logprobs: 0,
        }
    }
}

/// The most alternatives a token may report: the seam's limit, as a count.
pub const MAX_TOP_LOGPROBS: usize = switchyard_seam::MAX_TOP_LOGPROBS as usize;

/// A sampling parameter outside its range.
#[derive(Debug, thiserror::Error)]
pub enum SamplingError {
    #[error("sampling parameter `{field}` = {value} is invalid: it must be {expected}")]
    InvalidParam {
        field: &'static str,
        value: String,
        expected: &'static str,
    },

    #[error("logit_bias names token id {id}, but the vocabulary has {vocab_size} tokens")]
    BiasIdOutOfRange { id: u32, vocab_size: usize },

    #[error(
        "the logits row is empty or holds no finite value; the model produced no usable output"
    )]
    NoFiniteLogits,
}

impl SamplingParams {
    /// Checks every field's range; the error names the field and its value.
    pub fn validate(&self) -> Result<(), SamplingError> {
        check(
            "temperature",
            self.temperature,
            self.temperature.is_finite() && self.temperature >= 0.0,
            "a finite number >= 0",
        )?;
        check(
            "top_p",
            self.top_p,
            self.top_p > 0.0 && self.top_p <= 1.0,
            "in (0, 1]",
        )?;
        check(
            "min_p",
            self.min_p,
            (0.0..=1.0).contains(&self.min_p),
            "in [0, 1]",
        )?;
        check(
            "repetition_penalty",
            self.repetition_penalty,
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "a finite number > 0",
        )?;
        check(
            "presence_penalty",
            self.presence_penalty,
            (-2.0..=2.0).contains(&self.presence_penalty),
            "in [-2, 2]",
        )?;
        check(
            "frequency_penalty",
            self.frequency_penalty,
            (-2.0..=2.0).contains(&self.frequency_penalty),
            "in [-2, 2]",
        )?;
        for &(_, bias) in &self.logit_bias {
            check(
                "logit_bias",
                bias,
                (-100.0..=100.0).contains(&bias),
                "in [-100, 100]",
            )?;
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(SamplingError::InvalidParam {
                field: "top_logprobs",
                value: self.top_logprobs.to_string(),
                expected: "at most 20",
            });
        }
        Ok(())
    }

    /// [`validate`](Self::validate), and every `logit_bias` id inside the vocabulary.
    pub fn validate_for_vocab(&self, vocab_size: usize) -> Result<(), SamplingError> {
        self.validate()?;
        match self
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= vocab_size)
        {
            Some(&(id, _)) => Err(SamplingError::BiasIdOutOfRange { id, vocab_size }),
            None => Ok(()),
        }
    }
}

fn check(
    field: &'static str,
    value: f32,
    ok: bool,
    expected: &'static str,
) -> Result<(), SamplingError> {
    if ok {
        Ok(())
    } else {
        Err(SamplingError::InvalidParam {
            field,
            value: value.to_string(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_greedy() {
        let params = SamplingParams::default();
        params.validate().unwrap();
        assert_eq!(params.temperature, 0.0);
    }

    #[test]
    fn errors_name_the_field_and_value() {
        let params = SamplingParams {
            top_p: 1.5,
            ..SamplingParams::default()
        };
        let message = params.validate().unwrap_err().to_string();
        assert!(
            message.contains("top_p") && message.contains("1.5"),
            "{message}"
        );

        let params = SamplingParams {
            temperature: f32::NAN,
            ..SamplingParams::default()
        };
        assert!(params
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));

        let params = SamplingParams {
            logit_bias: vec![(7, 1.0)],
            ..SamplingParams::default()
        };
        params.validate().unwrap();
        let message = params.validate_for_vocab(5).unwrap_err().to_string();
        assert!(message.contains("token id 7"), "{message}");
    }
}
