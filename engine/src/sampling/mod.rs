//! Choosing the next token from logits, and deciding when to stop.
//!
//! [`SamplingParams`] are the request's knobs (validated once);
//! [`Sampler`] turns one row of logits into a [`SampledToken`];
//! [`StopChecker`] watches the generated tokens and text for stop tokens,
//! stop strings and the token limit, holding back text that may still turn
//! out to be the start of a stop string.

mod params;
mod sampler;
mod spread;
mod stop;

pub use params::{SamplingError, SamplingParams, MAX_TOP_LOGPROBS};
pub use sampler::{SampledToken, Sampler};
pub use stop::{FinishReason, StopChecker, StopCondition, StopStep};
pub use switchyard_kernels::argmax::argmax;
