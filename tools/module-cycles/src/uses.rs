//! What one module's own code mentions: its `use`s and its paths.

use std::collections::BTreeMap;

use syn::visit::Visit;

/// A module's mentions, as written (relative to the module).
#[derive(Debug, Default)]
pub struct Mentions {
    /// Names brought in by `use`, each with the path it stands for.
    pub imports: BTreeMap<String, Vec<String>>,
    /// Every path the code names: `use` targets (a glob's module), and paths of two or
    /// more segments. One segment names a local item, a variable or an import, whose
    /// `use` is already counted.
    pub paths: Vec<Vec<String>>,
    /// The targets of `pub use`s: a module's public face, which is no use of its own
    /// descendants (see `resolve.rs`).
    pub reexports: Vec<Vec<String>>,
}

/// The mentions of `items`, not counting those of nested modules (theirs).
pub fn collect(items: &[syn::Item]) -> Mentions {
    let mut collector = Collector::default();
    for item in items {
        collector.visit_item(item);
    }
    collector.mentions
}

#[derive(Default)]
struct Collector {
    mentions: Mentions,
    /// Inside a `pub use`.
    public: bool,
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // A nested module's code is its own.
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(crate)`, `pub(super)`: where an item may be seen, not a use.
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {
        // `#[cfg(test)]`, `#[error(...)]`: attribute names, not module paths.
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.public = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(Vec::new(), &item.tree);
        self.public = false;
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.mentions.paths.push(segments);
        }
        syn::visit::visit_path(self, path);
    }
}

impl Collector {
    fn use_tree(&mut self, mut prefix: Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
            }
            syn::UseTree::Name(name) if name.ident == "self" => {
                if let Some(last) = prefix.last().cloned() {
                    self.import(last, prefix);
                }
            }
            syn::UseTree::Name(name) => {
                let local = name.ident.to_string();
                prefix.push(local.clone());
                self.import(local, prefix);
            }
            syn::UseTree::Rename(rename) => {
                prefix.push(rename.ident.to_string());
                let local = rename.rename.to_string();
                if local == "_" {
                    self.mention(prefix);
                } else {
                    self.import(local, prefix);
                }
            }
            syn::UseTree::Glob(_) => self.mention(prefix),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix.clone(), tree);
                }
            }
        }
    }

    fn import(&mut self, local: String, path: Vec<String>) {
        self.mention(path.clone());
        self.mentions.imports.insert(local, path);
    }

    fn mention(&mut self, path: Vec<String>) {
        if self.public {
            self.mentions.reexports.push(path);
        } else {
            self.mentions.paths.push(path);
        }
    }
}
