//! Finds module cycles inside one crate: modules that reach each other through `use`s
//! and paths, however long the way round.
//!
//! Why not `cargo modules dependencies --acyclic`: building cargo-modules (it links
//! rust-analyzer) takes longer than the rest of the test run, and its `--acyclic` works
//! on items before they are folded into modules. Here the graph is of modules only: an
//! item's uses belong to its module. The tree comes from the source files (`mod`
//! declarations, `#[path]` included), each module's uses from every `use` and every
//! path of two or more segments in its code (paths inside macro calls are not seen),
//! resolved through re-exports to the module that defines the item. Declaring a child
//! (`mod x;`) is not a use, so a child may use its parent; a parent that also uses that
//! child closes a cycle.

mod graph;
mod resolve;
mod tree;
mod uses;
pub mod workspace;

use std::path::Path;

pub use graph::Cycle;

/// Every module cycle of the crate whose root file is `root` (`src/lib.rs`,
/// `src/main.rs`), one per group of modules that reach each other; empty when the uses
/// all point one way. An error when a file cannot be read or parsed.
pub fn find_cycles(root: &Path) -> Result<Vec<Cycle>, String> {
    let tree = tree::ModuleTree::load(root)?;
    let edges = resolve::edges(&tree);
    Ok(graph::cycles(&tree, &edges))
}
