//! From the paths a module mentions to the modules they land in.

use std::collections::BTreeSet;

use crate::tree::ModuleTree;

/// Re-exports chained deeper than this are given up on (a `use` cycle the compiler
/// would refuse anyway).
const MAX_HOPS: usize = 16;

/// `edges[m]`: the other modules module `m`'s code uses.
///
/// A `pub use` of a descendant's item is not counted: it puts the item on the module's
/// public face (as `mod` does the child itself) without the module's code depending on
/// it. A `pub use` of anything else is a use like any other.
pub fn edges(tree: &ModuleTree) -> Vec<BTreeSet<usize>> {
    tree.modules
        .iter()
        .enumerate()
        .map(|(from, module)| {
            let uses = module
                .mentions
                .paths
                .iter()
                .filter_map(|path| resolve(tree, from, path, 0));
            let reexports = module
                .mentions
                .reexports
                .iter()
                .filter_map(|path| resolve(tree, from, path, 0))
                .filter(|&to| !is_descendant(tree, to, from));
            uses.chain(reexports).filter(|&to| to != from).collect()
        })
        .collect()
}

/// Whether module `module` lies below `ancestor`.
fn is_descendant(tree: &ModuleTree, module: usize, ancestor: usize) -> bool {
    let mut at = tree.modules[module].parent;
    while let Some(parent) = at {
        if parent == ancestor {
            return true;
        }
        at = tree.modules[parent].parent;
    }
    false
}

/// The module of this crate that `path`, written in module `from`, lands in: the
/// module it names, or the one defining the item it names (through re-exports).
/// `None` for paths outside the crate (other crates, the prelude) and local items.
fn resolve(tree: &ModuleTree, from: usize, path: &[String], hops: usize) -> Option<usize> {
    if hops > MAX_HOPS {
        return None;
    }
    let module = &tree.modules[from];
    let first = path.first()?;
    let (mut at, rest) = match first.as_str() {
        "crate" => (0, &path[1..]),
        "self" => (from, &path[1..]),
        "super" => {
            let supers = path.iter().take_while(|s| *s == "super").count();
            let mut at = from;
            for _ in 0..supers {
                at = tree.modules[at].parent?;
            }
            (at, &path[supers..])
        }
        name if module.children.contains_key(name) => (from, path),
        name => {
            let imported = module.mentions.imports.get(name)?;
            // An import of itself (`use foo;` of an outside crate) goes nowhere.
            if imported.len() == 1 && imported[0] == *name {
                return None;
            }
            let whole: Vec<String> = imported.iter().chain(&path[1..]).cloned().collect();
            return resolve(tree, from, &whole, hops + 1);
        }
    };
    for (i, segment) in rest.iter().enumerate() {
        let here = &tree.modules[at];
        if let Some(&child) = here.children.get(segment) {
            at = child;
        } else if let Some(imported) = here.mentions.imports.get(segment) {
            // A re-export: the item lives where the `use` points.
            let whole: Vec<String> = imported.iter().chain(&rest[i + 1..]).cloned().collect();
            return resolve(tree, at, &whole, hops + 1).or(Some(at));
        } else {
            break;
        }
    }
    Some(at)
}
