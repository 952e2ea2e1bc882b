//! One module per subcommand: its arguments and its `run`.

pub mod generate;
pub mod load;
pub mod npy;
pub mod logits;
pub mod synth;
pub mod tokenize;
