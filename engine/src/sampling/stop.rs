//! Stop conditions: stop tokens, stop strings and a token limit.
//!
//! Generated text reaches the client piece by piece, and a stop string can
//! straddle pieces. So text that could be the start of a stop string is held
//! back until the next pieces show whether it is one (then it is cut, with
//! everything after it) or not (then it is released).

pub use switchyard_seam::FinishReason;
use switchyard_seam::{TokenMargin, UnsureStop};

/// When to stop generating.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StopCondition {
    /// Tokens that end generation (EOS, end of turn); their text is not output.
    pub stop_token_ids: Vec<u32>,
    /// Texts that end generation; they and anything after them are not output.
    pub stop_strings: Vec<String>,
    /// The most tokens to generate; `None` for no limit.
    pub max_tokens: Option<usize>,
    /// Stop at the first token (or with `every_token`, any token) that was too unsure
    /// ([`UnsureStop`]): a cascade's early escalation.
    pub unsure: Option<UnsureStop>,
}

/// What one generated token produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopStep {
    /// Text to send on now (may be empty while text is held back).
    pub text: String,
    /// Set when generation must end after this token.
    pub finished: Option<FinishReason>,
}

/// Applies a [`StopCondition`] to a stream of generated tokens and their text.
#[derive(Clone, Debug)]
pub struct StopChecker {
    condition: StopCondition,
    generated: usize,
    /// Text withheld because it may begin a stop string.
    held: String,
    finished: Option<FinishReason>,
}

impl StopChecker {
    /// A checker for `condition`; empty stop strings are ignored.
    pub fn new(mut condition: StopCondition) -> StopChecker {
        condition.stop_strings.retain(|s| !s.is_empty());
        StopChecker {
            condition,
            generated: 0,
            held: String::new(),
            finished: None,
        }
    }

    /// Tokens seen so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Why generation finished, once it has.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finished
    }

    /// Feeds one generated token and the new text it decoded to (empty
    /// while a character is incomplete). After a step reports `finished`,
    /// further pushes return nothing.
    pub fn push(&mut self, token: u32, text: &str) -> StopStep {
        if self.finished.is_some() {
            return StopStep::default();
        }
        self.generated += 1;
        if self.condition.stop_token_ids.contains(&token) {
            let held = std::mem::take(&mut self.held);
            return self.finish(FinishReason::Stop, held);
        }

        let mut buffer = std::mem::take(&mut self.held);
        buffer.push_str(text);
        if let Some(at) = self.first_stop_string(&buffer) {
            buffer.truncate(at);
            return self.finish(FinishReason::Stop, buffer);
        }
        if self
            .condition
            .max_tokens
            .is_some_and(|max| self.generated >= max)
        {
            return self.finish(FinishReason::Length, buffer);
        }
        let keep = self.partial_stop_suffix(&buffer);
        self.held = buffer.split_off(buffer.len() - keep);
        StopStep {
            text: buffer,
            finished: None,
        }
    }

    /// After [`StopChecker::push`] of a token that did not finish the generation: whether
    /// its `margin` ends it as [`FinishReason::Unsure`] ([`UnsureStop::stops_at`]: the
    /// first token, or any with `every_token`). The held text goes with the step then (a
    /// stop string can no longer complete).
    pub fn stop_unsure(&mut self, step: &mut StopStep, margin: &TokenMargin) {
        let index = self.generated.saturating_sub(1);
        let unsure = self
            .condition
            .unsure
            .is_some_and(|u| u.stops_at(index, margin));
        if step.finished.is_none() && self.generated > 0 && unsure {
            step.text.push_str(&std::mem::take(&mut self.held));
            self.finished = Some(FinishReason::Unsure);
            step.finished = Some(FinishReason::Unsure);
        }
    }

    /// Releases held-back text when generation ends for another reason
    /// (for example the client went away or the engine stopped it).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    fn finish(&mut self, reason: FinishReason, text: String) -> StopStep {
        self.finished = Some(reason);
        StopStep {
            text,
            finished: Some(reason),
        }
    }

    /// Byte offset of the earliest stop string in `text`.
    fn first_stop_string(&self, text: &str) -> Option<usize> {
        self.condition
            .stop_strings
            .iter()
            .filter_map(|stop| text.find(stop.as_str()))
            .min()
    }

    /// Length of the longest suffix of `text` that is a proper prefix of a
    /// stop string (always on a char boundary).
    fn partial_stop_suffix(&self, text: &str) -> usize {
        text.char_indices()
            .map(|(i, _)| i)
            .find(|&start| {
                let suffix = &text[start..];
                self.condition
                    .stop_strings
                    .iter()
                    .any(|stop| stop.len() > suffix.len() && stop.starts_with(suffix))
            })
            .map_or(0, |start| text.len() - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checker(stops: &[&str], max_tokens: Option<usize>) -> StopChecker {
        StopChecker::new(StopCondition {
            stop_token_ids: vec![99],
            stop_strings: stops.iter().map(|s| s.to_string()).collect(),
            max_tokens,
            unsure: None,
        })
    }

    #[test]
    fn an_unsure_stop_ends_at_the_first_token_it_compares_below_its_threshold() {
        let sure = TokenMargin {
            margin: 2.0,
            entropy: 0.1,
        };
        let unsure = TokenMargin {
            margin: 0.2,
            entropy: 2.0,
        };
        let run = |every_token: bool| {
            let mut c = StopChecker::new(StopCondition {
                unsure: Some(UnsureStop {
                    statistic: switchyard_seam::MarginStatistic::Margin,
                    min: 1.0,
                    every_token,
                }),
                ..StopCondition::default()
            });
            let mut ended = None;
            for (i, margin) in [sure, sure, unsure, sure].iter().enumerate() {
                let mut step = c.push(i as u32, "x");
                c.stop_unsure(&mut step, margin);
                if step.finished.is_some() {
                    ended = Some((c.generated(), step.finished));
                    break;
                }
            }
            ended
        };
        // A first-token stop lets a sure first token through for good.
        assert_eq!(run(false), None);
        // An every-token stop ends at the third token, the first unsure one.
        assert_eq!(run(true), Some((3, Some(FinishReason::Unsure))));
    }

    #[test]
    fn stop_string_split_across_tokens_is_caught_and_trimmed() {
        let mut c = checker(&["</end>"], None);
        assert_eq!(
            c.push(1, "Hello </"),
            StopStep {
                text: "Hello ".into(),
                finished: None
            }
        );
        assert_eq!(
            c.push(2, "en"),
            StopStep {
                text: "".into(),
                finished: None
            }
        );
        let step = c.push(3, "d> tail");
        assert_eq!(
            step,
            StopStep {
                text: "".into(),
                finished: Some(FinishReason::Stop)
            }
        );
        assert_eq!(c.push(4, "more"), StopStep::default());
    }

    #[test]
    fn held_text_is_released_when_it_is_not_a_stop() {
        let mut c = checker(&["</end>"], None);
        assert_eq!(c.push(1, "a </e").text, "a ");
        assert_eq!(c.push(2, "x").text, "</ex");
        assert_eq!(c.push(3, " <").text, " ");
        assert_eq!(c.flush(), "<");
    }

    #[test]
    fn text_before_a_stop_string_in_one_piece_is_kept() {
        let mut c = checker(&["STOP", "ST"], None);
        let step = c.push(1, "abcSTOPdef");
        assert_eq!(step.text, "abc");
        assert_eq!(step.finished, Some(FinishReason::Stop));
    }

    #[test]
    fn stop_token_ends_and_releases_held_text() {
        let mut c = checker(&["</end>"], None);
        assert_eq!(c.push(1, "x </").text, "x ");
        let step = c.push(99, "<|im_end|>");
        assert_eq!(step.text, "</");
        assert_eq!(step.finished, Some(FinishReason::Stop));
    }

    #[test]
    fn max_tokens_ends_with_length_and_releases_held_text() {
        let mut c = checker(&["</end>"], Some(2));
        assert_eq!(c.push(1, "a").finished, None);
        let step = c.push(2, "</");
        assert_eq!(
            step,
            StopStep {
                text: "</".into(),
                finished: Some(FinishReason::Length)
            }
        );
        assert_eq!(c.finished(), Some(FinishReason::Length));
    }

    #[test]
    fn multibyte_partial_matches_stay_on_char_boundaries() {
        let mut c = checker(&["é!"], None);
        assert_eq!(c.push(1, "caf é").text, "caf ");
        assert_eq!(c.push(2, "?").text, "é?");
    }
}
