//! The module tree of a crate, read from its source files, with what each module's
//! code mentions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::uses::{collect, Mentions};

/// One module: where it sits and what its own code mentions.
#[derive(Debug)]
pub struct Module {
    /// `crate::a::b`.
    pub name: String,
    /// The module that declares it; `None` for the crate root.
    pub parent: Option<usize>,
    /// Declared child modules by name.
    pub children: BTreeMap<String, usize>,
    /// What the module's code mentions and imports.
    pub mentions: Mentions,
}

/// Every module of one crate; the root is module 0.
#[derive(Debug)]
pub struct ModuleTree {
    /// By index; children come after their parent.
    pub modules: Vec<Module>,
}

impl ModuleTree {
    /// Reads the crate whose root file is `root`, following every `mod` declaration.
    pub fn load(root: &Path) -> Result<ModuleTree, String> {
        let mut tree = ModuleTree {
            modules: Vec::new(),
        };
        let items = parse(root)?;
        let dir = root.parent().map(Path::to_path_buf).unwrap_or_default();
        tree.add("crate".to_owned(), None, &items, &dir, &dir)?;
        Ok(tree)
    }

    /// Adds the module `name` holding `items`; its file lies in `file_dir`, and the files
    /// of its children in `child_dir`.
    fn add(
        &mut self,
        name: String,
        parent: Option<usize>,
        items: &[syn::Item],
        file_dir: &Path,
        child_dir: &Path,
    ) -> Result<usize, String> {
        let index = self.modules.len();
        self.modules.push(Module {
            name: name.clone(),
            parent,
            children: BTreeMap::new(),
            mentions: collect(items),
        });
        for item in items {
            let syn::Item::Mod(declared) = item else {
                continue;
            };
            let child_name = declared.ident.to_string();
            let full_name = format!("{name}::{child_name}");
            let child = match &declared.content {
                Some((_, inline)) => {
                    let dir = child_dir.join(&child_name);
                    self.add(full_name, Some(index), inline, file_dir, &dir)?
                }
                None => {
                    let Some(file) = module_file(declared, file_dir, child_dir) else {
                        // A module behind `cfg` for another platform may have no file
                        // here; any other missing file is the compiler's error first.
                        if is_cfg_gated(declared) {
                            continue;
                        }
                        return Err(format!(
                            "{full_name}: no file for `mod {child_name};` in {}",
                            child_dir.display()
                        ));
                    };
                    let items = parse(&file)?;
                    let file_dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
                    let grandchildren = if file.file_name().is_some_and(|f| f == "mod.rs") {
                        file_dir.clone()
                    } else {
                        child_dir.join(&child_name)
                    };
                    self.add(full_name, Some(index), &items, &file_dir, &grandchildren)?
                }
            };
            self.modules[index].children.insert(child_name, child);
        }
        Ok(index)
    }
}

/// The file of `mod name;`: its `#[path]`, else `name.rs` or `name/mod.rs`.
fn module_file(declared: &syn::ItemMod, file_dir: &Path, child_dir: &Path) -> Option<PathBuf> {
    if let Some(path) = path_attribute(declared) {
        let file = file_dir.join(path);
        return file.is_file().then_some(file);
    }
    let name = declared.ident.to_string();
    [
        child_dir.join(format!("{name}.rs")),
        child_dir.join(&name).join("mod.rs"),
    ]
    .into_iter()
    .find(|file| file.is_file())
}

fn path_attribute(declared: &syn::ItemMod) -> Option<String> {
    declared.attrs.iter().find_map(|attr| {
        let syn::Meta::NameValue(pair) = &attr.meta else {
            return None;
        };
        if !pair.path.is_ident("path") {
            return None;
        }
        match &pair.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) => Some(text.value()),
            _ => None,
        }
    })
}

fn is_cfg_gated(declared: &syn::ItemMod) -> bool {
    declared
        .attrs
        .iter()
        .any(|attr| attr.path().is_ident("cfg"))
}

fn parse(file: &Path) -> Result<Vec<syn::Item>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|error| format!("{}: cannot read: {error}", file.display()))?;
    syn::parse_file(&text)
        .map(|parsed| parsed.items)
        .map_err(|error| format!("{}: cannot parse: {error}", file.display()))
}
