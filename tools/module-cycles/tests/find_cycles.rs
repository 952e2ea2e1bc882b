//! The checker on small crates written for each case.

use std::fs;
use std::path::Path;

use switchyard_module_cycles::find_cycles;

/// Writes `files` (path, text) under a fresh directory and checks the crate rooted at
/// its `lib.rs`.
fn cycles_of(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (path, text) in files {
        let path = dir.path().join(path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("a directory");
        }
        fs::write(&path, text).expect("a file");
    }
    match find_cycles(&dir.path().join("lib.rs")) {
        Ok(cycles) => cycles.iter().map(ToString::to_string).collect(),
        Err(error) => vec![format!("error: {error}")],
    }
}

#[test]
fn uses_that_point_one_way_pass() {
    let cycles = cycles_of(&[
        ("lib.rs", "pub mod a; pub mod b; pub use a::A;"),
        ("a.rs", "use crate::b::B; pub struct A(B);"),
        (
            "b.rs",
            "pub struct B; #[cfg(test)] mod tests { use super::*; }",
        ),
    ]);
    assert_eq!(cycles, Vec::<String>::new());
}

#[test]
fn a_cycle_is_named_with_a_way_round() {
    let cycles = cycles_of(&[
        ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
        ("a.rs", "pub struct A; pub fn f() { crate::b::g(); }"),
        ("b.rs", "use crate::c::C; pub fn g() {}"),
        ("c/mod.rs", "pub struct C(crate::a::A);"),
    ]);
    assert_eq!(
        cycles,
        vec!["3 modules in one cycle: crate::a, crate::b, crate::c\n  \
              e.g. crate::a -> crate::b -> crate::c -> crate::a"
            .to_owned()]
    );
}

#[test]
fn re_exports_resolve_to_the_defining_module() {
    // `b` uses `A` through the root's re-export; the root uses `b`. That is not a
    // cycle through the root: `A` lives in `a`.
    let cycles = cycles_of(&[
        (
            "lib.rs",
            "mod a; mod b; pub use a::A; pub fn run() { b::go(); }",
        ),
        ("a.rs", "pub struct A;"),
        ("b.rs", "use crate::A; pub fn go() { let _ = A; }"),
    ]);
    assert_eq!(cycles, Vec::<String>::new());
}

#[test]
fn a_parent_and_a_child_using_each_other_is_a_cycle() {
    let cycles = cycles_of(&[
        ("lib.rs", "pub mod outer;"),
        (
            "outer/mod.rs",
            "pub mod inner; pub struct Shared; pub fn make() -> inner::Thing { inner::Thing(Shared) }",
        ),
        ("outer/inner.rs", "use super::Shared; pub struct Thing(pub Shared);"),
    ]);
    assert_eq!(
        cycles,
        vec![
            "2 modules in one cycle: crate::outer, crate::outer::inner\n  \
              e.g. crate::outer -> crate::outer::inner -> crate::outer"
                .to_owned()
        ]
    );
}

#[test]
fn re_exporting_a_childs_item_is_not_a_use_of_it() {
    // The parent's public face names the child's item; its code does not use it.
    let cycles = cycles_of(&[
        ("lib.rs", "pub mod outer;"),
        (
            "outer/mod.rs",
            "pub mod inner; pub struct Shared; pub use inner::Thing;",
        ),
        (
            "outer/inner.rs",
            "use super::Shared; pub struct Thing(Shared);",
        ),
    ]);
    assert_eq!(cycles, Vec::<String>::new());
}

#[test]
fn path_attributes_and_inline_modules_are_followed() {
    let cycles = cycles_of(&[
        (
            "lib.rs",
            "#[path = \"elsewhere/x.rs\"] mod x; mod y { pub fn f() { crate::x::g(); } }",
        ),
        ("elsewhere/x.rs", "pub fn g() { crate::y::f(); }"),
    ]);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(
        cycles[0].contains("crate::x -> crate::y -> crate::x"),
        "{cycles:?}"
    );
}

#[test]
fn a_missing_module_file_is_an_error() {
    let cycles = cycles_of(&[("lib.rs", "mod gone;")]);
    assert_eq!(cycles.len(), 1);
    assert!(
        cycles[0].starts_with("error: crate::gone: no file"),
        "{cycles:?}"
    );
    // Unless it is for another platform.
    assert!(cycles_of(&[("lib.rs", "#[cfg(windows)] mod gone;")]).is_empty());
}

#[test]
fn the_checker_itself_has_no_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    assert_eq!(find_cycles(&root), Ok(Vec::new()));
}
