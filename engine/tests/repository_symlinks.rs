//! Issue 17, case 7: the repository scan follows symlinks only while they stay inside
//! the repository; one that leads out is a problem naming its target, not a version.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test
#![cfg(unix)]

use std::fs;
use std::os::unix::fs::symlink;

use switchyard_engine::repository::ModelRepository;
use switchyard_engine::synthetic::{write_gguf, Preset, SyntheticSpec};
use switchyard_kernels::DType;

#[test]
fn links_out_of_the_repository_are_problems_links_inside_are_followed() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    let root = dir.path().join("repo");
    fs::create_dir_all(&outside).unwrap();
    let spec = SyntheticSpec {
        preset: Preset::Smollm2,
        dtype: DType::Q4_1,
        seed: 5,
    };
    let source = outside.join("model.gguf");
    write_gguf(&spec, &source).unwrap();

    // m/1: a real file. m/2: a file linked from outside. m/3: a folder linked from
    // outside. m/4: a link to m/1's file, inside the repository.
    fs::create_dir_all(root.join("m/1")).unwrap();
    fs::copy(&source, root.join("m/1/model.gguf")).unwrap();
    fs::create_dir_all(root.join("m/2")).unwrap();
    symlink(&source, root.join("m/2/model.gguf")).unwrap();
    symlink(&outside, root.join("m/3")).unwrap();
    fs::create_dir_all(root.join("m/4")).unwrap();
    symlink(root.join("m/1/model.gguf"), root.join("m/4/model.gguf")).unwrap();
    // A whole model folder linked from outside.
    symlink(&outside, root.join("n")).unwrap();

    let repository = ModelRepository::open(&root).unwrap();
    let names: Vec<_> = repository.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["m"]);
    let versions: Vec<_> = repository.models[0]
        .versions
        .iter()
        .map(|v| v.version.as_str())
        .collect();
    assert_eq!(versions, ["1", "4"]);
    let problems: Vec<String> = repository
        .problems
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    for problem in &problems {
        assert!(problem.contains("outside the repository"), "{problem}");
    }
}
