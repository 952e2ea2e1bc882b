//! One module per subcommand: its arguments and its `run`.

pub mod demo_repo;
pub mod device;
pub mod generate;
pub mod logits;
pub mod models;
pub mod npy;
pub mod policy;
pub mod serve;
pub mod synth;
pub mod tokenize;
