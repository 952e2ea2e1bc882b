//! Quantizers: f32 → each block format (scalar; used offline to make
//! checkpoints, never on the serving path).
