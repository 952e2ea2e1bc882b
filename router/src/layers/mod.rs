//! The router's tower layers, one idea per file.
//!
//! Order in [`crate::app`], outermost first: request id → trace → request
//! metrics → body limit → (inference routes only) timeout → load shedding.

pub mod body_limit;
pub mod guarded_body;
pub mod request_id;
pub mod request_metrics;
pub mod shed;
pub mod timeout;
