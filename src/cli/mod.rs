//! One module per subcommand: its arguments and its `run`.

pub mod calibrate;
pub mod console;
pub mod demo_repo;
pub mod device;
pub mod eval;
pub mod generate;
pub mod layer_draft;
pub mod logging;
pub mod logits;
pub mod models;
pub mod npy;
pub mod policy;
pub mod quality;
pub mod report;
pub mod serve;
pub mod speculate;
pub mod synth;
pub mod tokenize;
