//! The response tail: from a request's generation requests to its answer, whole or
//! streamed. Each fact about how a request ends has its home here:
//!
//! - [`submit`]: the generations are submitted (on the policy's fallback when the
//!   chosen checkpoint refuses them);
//! - [`choice`]: each runs as a [`choice::Choice`], the one place that notices a
//!   generation whose stream closed without saying how it ended;
//! - [`settle`]: the request's usage is tallied (each prompt once, every completion
//!   token) and the route settled, once, whichever way the answer ends;
//! - [`finished`]: a choice read to its end;
//! - [`whole`] waits for every choice (with the cascade's and fallbacks' retries);
//!   [`stream`] frames the choices' events as OpenAI's server-sent events (under a
//!   cascade, once the verdict is known: a judged answer is replayed);
//! - [`handoff`]: a cascade's deferred answer handed to the next model, which continues
//!   its sure part.

pub mod choice;
pub mod finished;
pub mod handoff;
pub mod settle;
pub mod stream;
pub mod submit;
pub mod whole;
