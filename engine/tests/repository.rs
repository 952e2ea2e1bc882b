//! The model repository: layout scanning, model.toml, version policies,
//! aliases, resolution, and problems that skip one entry but not the rest.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::fs;
use std::path::{Path, PathBuf};

use switchyard_engine::formats::{load_checkpoint, CheckpointFormat};
use switchyard_engine::repository::{ModelRepository, RepositoryError, VersionPolicy};
use switchyard_engine::synthetic::{write_gguf, write_safetensors, Preset, SyntheticSpec};
use switchyard_kernels::DType;
use tempfile::TempDir;

/// One synthetic GGUF, written once per test and copied where needed.
struct Fixture {
    dir: TempDir,
    gguf: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = TempDir::new().unwrap();
        let gguf = dir.path().join("source.gguf");
        let spec = SyntheticSpec {
            preset: Preset::Smollm2,
            dtype: DType::Q4_1,
            seed: 5,
        };
        write_gguf(&spec, &gguf).unwrap();
        fs::create_dir(dir.path().join("repo")).unwrap();
        Fixture { dir, gguf }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    /// Puts the synthetic GGUF at `REPO/<model>/<version>/model.gguf`.
    fn add_gguf(&self, model: &str, version: &str) -> PathBuf {
        let dir = self.root().join(model).join(version);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.gguf");
        fs::copy(&self.gguf, &path).unwrap();
        path
    }

    fn model_toml(&self, model: &str, text: &str) {
        let dir = self.root().join(model);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("model.toml"), text).unwrap();
    }

    fn open(&self) -> ModelRepository {
        ModelRepository::open(&self.root()).unwrap()
    }
}

fn versions(list: &[&switchyard_engine::repository::RepoVersion]) -> Vec<String> {
    list.iter().map(|v| v.version.clone()).collect()
}

fn problem_text(repo: &ModelRepository) -> String {
    repo.problems
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn versions_sort_numerically_and_default_policy_serves_the_latest() {
    let fx = Fixture::new();
    for v in ["10", "2", "1"] {
        fx.add_gguf("m", v);
    }
    let repo = fx.open();
    assert!(repo.problems.is_empty(), "{}", problem_text(&repo));
    let m = repo.model("m").unwrap();
    let all: Vec<_> = m.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(all, vec!["1", "2", "10"]);
    assert_eq!(m.policy, VersionPolicy::Latest(1));
    assert_eq!(versions(&m.served_versions()), vec!["10"]);
    assert_eq!(m.default_version().unwrap().version, "10");
    assert!(m.serves("10") && !m.serves("2"));
}

#[test]
fn non_numeric_versions_sort_after_numeric_ones() {
    let fx = Fixture::new();
    for v in ["beta", "3", "alpha"] {
        fx.add_gguf("m", v);
    }
    fx.model_toml("m", "[version_policy]\nall = true\n");
    let repo = fx.open();
    let m = repo.model("m").unwrap();
    assert_eq!(versions(&m.served_versions()), vec!["3", "alpha", "beta"]);
}

#[test]
fn policies_latest_all_and_list() {
    let fx = Fixture::new();
    for model in ["latest", "all", "list"] {
        for v in ["1", "2", "3"] {
            fx.add_gguf(model, v);
        }
    }
    fx.model_toml("latest", "[version_policy]\nlatest = 2\n");
    fx.model_toml("all", "[version_policy]\nall = true\n");
    fx.model_toml(
        "list",
        "default_version = \"1\"\n[version_policy]\nversions = [\"1\", \"3\"]\n",
    );
    let repo = fx.open();
    assert!(repo.problems.is_empty(), "{}", problem_text(&repo));
    let served = |name: &str| versions(&repo.model(name).unwrap().served_versions());
    assert_eq!(served("latest"), vec!["2", "3"]);
    assert_eq!(served("all"), vec!["1", "2", "3"]);
    assert_eq!(served("list"), vec!["1", "3"]);
    let list = repo.model("list").unwrap();
    assert_eq!(list.default_version.as_deref(), Some("1"));
    assert_eq!(list.default_version().unwrap().version, "1");
    assert_eq!(
        repo.model("all")
            .unwrap()
            .default_version()
            .unwrap()
            .version,
        "3"
    );
}

#[test]
fn aliases_and_resolve() {
    let fx = Fixture::new();
    fx.add_gguf("smol", "1");
    let v2 = fx.add_gguf("smol", "2");
    fx.add_gguf("other", "1");
    fx.model_toml(
        "smol",
        "aliases = [\"small\", \"chat\"]\ndefault_version = \"2\"\n[version_policy]\nall = true\n",
    );
    let repo = fx.open();
    assert!(repo.problems.is_empty(), "{}", problem_text(&repo));

    let (m, v) = repo.resolve("small").unwrap();
    assert_eq!((m.name.as_str(), v.version.as_str()), ("smol", "2"));
    assert_eq!(v.path, v2);
    let (m, v) = repo.resolve("chat@1").unwrap();
    assert_eq!((m.name.as_str(), v.version.as_str()), ("smol", "1"));
    let (m, v) = repo.resolve("other").unwrap();
    assert_eq!((m.name.as_str(), v.version.as_str()), ("other", "1"));
    assert_eq!(repo.model("chat").unwrap().name, "smol");
    assert!(repo.model("nope").is_none());

    let err = repo.resolve("nope").unwrap_err();
    assert!(matches!(err, RepositoryError::UnknownModel { .. }), "{err}");
    assert!(err.to_string().contains("other, smol"), "{err}");
    let err = repo.resolve("smol@7").unwrap_err();
    assert!(
        matches!(err, RepositoryError::UnknownVersion { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("1, 2"), "{err}");
    for spec in ["smol@", "@1", "", "smol@1@2"] {
        let err = repo.resolve(spec).unwrap_err();
        assert!(
            matches!(err, RepositoryError::BadSpec { .. }),
            "{spec}: {err}"
        );
    }
}

#[test]
fn resolve_gives_versions_on_disk_even_when_not_served() {
    let fx = Fixture::new();
    fx.add_gguf("m", "1");
    fx.add_gguf("m", "2");
    let repo = fx.open();
    let (m, v) = repo.resolve("m@1").unwrap();
    assert_eq!(v.version, "1");
    assert!(!m.serves("1"));
}

#[test]
fn versions_describe_their_checkpoints() {
    let fx = Fixture::new();
    let gguf = fx.add_gguf("g", "1");
    let hf_dir = fx.root().join("hf").join("1");
    let spec = SyntheticSpec {
        preset: Preset::Qwen2,
        dtype: DType::F16,
        seed: 1,
    };
    write_safetensors(&spec, &hf_dir, 1).unwrap();
    let repo = fx.open();
    assert!(repo.problems.is_empty(), "{}", problem_text(&repo));

    let g = &repo.model("g").unwrap().versions[0];
    assert_eq!(g.format, CheckpointFormat::Gguf);
    assert_eq!(g.architecture, "llama");
    assert_eq!(g.path, gguf);
    assert_eq!(g.bytes, fs::metadata(&gguf).unwrap().len());
    let ckpt = load_checkpoint(&g.path).unwrap();
    let params: u64 = ckpt
        .tensors
        .values()
        .map(|t| t.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(g.parameters, params);

    let hf = &repo.model("hf").unwrap().versions[0];
    assert_eq!(hf.format, CheckpointFormat::Safetensors);
    assert_eq!(hf.architecture, "qwen2");
    assert_eq!(hf.path, hf_dir);
    assert!(hf.parameters > 0);
    let folder_bytes: u64 = fs::read_dir(&hf_dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(hf.bytes, folder_bytes);
}

#[test]
fn corrupt_gguf_is_a_problem_and_the_rest_loads() {
    let fx = Fixture::new();
    fx.add_gguf("m", "1");
    let bad = fx.root().join("m").join("2");
    fs::create_dir_all(&bad).unwrap();
    let mut bytes = fs::read(&fx.gguf).unwrap();
    bytes.truncate(bytes.len() / 2);
    fs::write(bad.join("model.gguf"), bytes).unwrap();
    fx.add_gguf("n", "1");
    let garbage = fx.root().join("n").join("2");
    fs::create_dir_all(&garbage).unwrap();
    fs::write(garbage.join("x.gguf"), b"not a checkpoint at all").unwrap();

    let repo = fx.open();
    assert_eq!(repo.problems.len(), 2, "{}", problem_text(&repo));
    assert_eq!(repo.problems[0].path, bad);
    assert!(
        repo.problems[0].reason.contains("truncated"),
        "{}",
        problem_text(&repo)
    );
    assert_eq!(repo.problems[1].path, garbage);
    // The broken versions are skipped; version 1 of each model still serves.
    for name in ["m", "n"] {
        let m = repo.model(name).unwrap();
        assert_eq!(versions(&m.served_versions()), vec!["1"]);
    }
}

#[test]
fn bad_model_toml_skips_that_model_only() {
    let fx = Fixture::new();
    fx.add_gguf("broken", "1");
    fx.model_toml(
        "broken",
        "aliases = [\"x\"]\n[version_policy]\nlatest = \"two\"\n",
    );
    fx.add_gguf("typo", "1");
    fx.model_toml("typo", "alias = [\"y\"]\n");
    fx.add_gguf("fine", "1");
    let repo = fx.open();
    let names: Vec<_> = repo.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, vec!["fine"]);
    assert_eq!(repo.problems.len(), 2, "{}", problem_text(&repo));
    let broken = &repo.problems[0];
    assert_eq!(broken.path, fx.root().join("broken/model.toml"));
    assert!(broken.reason.contains("line 3, column 10"), "{broken}");
    let typo = &repo.problems[1];
    assert!(typo.reason.contains("line 1, column 1"), "{typo}");
    assert!(typo.reason.contains("alias"), "{typo}");
}

#[test]
fn alias_clashes_are_problems_naming_both() {
    let fx = Fixture::new();
    for model in ["a", "b", "c"] {
        fx.add_gguf(model, "1");
    }
    fx.model_toml("a", "aliases = [\"chat\", \"only-a\"]\n");
    fx.model_toml("b", "aliases = [\"chat\", \"c\"]\n");
    let repo = fx.open();
    let text = problem_text(&repo);
    assert_eq!(repo.problems.len(), 2, "{text}");
    assert!(
        text.contains("'chat' is claimed by models a and b"),
        "{text}"
    );
    assert!(
        text.contains("alias 'c' of model 'b' is the name of model 'c'"),
        "{text}"
    );
    assert_eq!(repo.model("a").unwrap().aliases, vec!["only-a"]);
    assert!(repo.model("b").unwrap().aliases.is_empty());
    assert!(repo.model("chat").is_none());
    assert_eq!(repo.model("c").unwrap().name, "c");
}

#[test]
fn policy_and_default_mistakes_are_reported() {
    let fx = Fixture::new();
    fx.add_gguf("m", "1");
    fx.add_gguf("m", "2");
    fx.model_toml(
        "m",
        "default_version = \"1\"\n[version_policy]\nversions = [\"2\", \"9\"]\n",
    );
    let repo = fx.open();
    let text = problem_text(&repo);
    assert_eq!(repo.problems.len(), 2, "{text}");
    assert!(text.contains("lists version '9'"), "{text}");
    assert!(text.contains("default_version '1' is not served"), "{text}");
    let m = repo.model("m").unwrap();
    assert_eq!(m.default_version, None);
    assert_eq!(m.default_version().unwrap().version, "2");
}

#[test]
fn bad_names_and_empty_folders_are_problems() {
    let fx = Fixture::new();
    fx.add_gguf("good", "1");
    fx.add_gguf("bad@name", "1");
    fx.add_gguf("good", "v 2");
    fs::create_dir_all(fx.root().join("empty")).unwrap();
    let two = fx.root().join("twice").join("1");
    fs::create_dir_all(&two).unwrap();
    fs::copy(&fx.gguf, two.join("a.gguf")).unwrap();
    fs::copy(&fx.gguf, two.join("b.gguf")).unwrap();
    fs::write(fx.root().join("README.txt"), "not a model").unwrap();
    fs::create_dir_all(fx.root().join(".hidden")).unwrap();

    let repo = fx.open();
    let text = problem_text(&repo);
    let names: Vec<_> = repo.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, vec!["good"], "{text}");
    assert!(
        text.contains("'bad@name' is not a valid model name"),
        "{text}"
    );
    assert!(text.contains("'v 2' is not a valid version name"), "{text}");
    assert!(text.contains("a.gguf, b.gguf"), "{text}");
    let empty: &Path = &fx.root().join("empty");
    assert!(repo.problems.iter().any(|p| p.path == empty), "{text}");
}

#[test]
fn unreadable_root_is_an_error() {
    let dir = TempDir::new().unwrap();
    let err = ModelRepository::open(&dir.path().join("missing")).unwrap_err();
    assert!(
        matches!(err, RepositoryError::RootUnreadable { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn adapters_are_found_beside_their_model_and_clashes_are_problems() {
    let fx = Fixture::new();
    fx.add_gguf("m", "1");
    fx.add_gguf("other", "1");
    let adapters = fx.root().join("m").join("adapters");
    // A PEFT folder, a GGUF adapter, an empty version and a name clash.
    fs::create_dir_all(adapters.join("pirate/1")).unwrap();
    fs::write(adapters.join("pirate/1/adapter_config.json"), "{}").unwrap();
    fs::create_dir_all(adapters.join("pirate/2")).unwrap();
    fs::write(adapters.join("pirate/2/p.gguf"), b"GGUF").unwrap();
    fs::create_dir_all(adapters.join("pirate/3")).unwrap();
    fs::create_dir_all(adapters.join("other/1")).unwrap();
    fs::write(adapters.join("other/1/adapter_config.json"), "{}").unwrap();
    let repo = fx.open();
    let m = repo.model("m").unwrap();
    // `adapters/` is not a version of `m`.
    assert_eq!(versions(&m.served_versions()), vec!["1"]);
    assert_eq!(m.adapters.len(), 1, "{:?}", m.adapters);
    let pirate = &m.adapters[0];
    assert_eq!(pirate.name, "pirate");
    let found: Vec<_> = pirate.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(found, vec!["1", "2"]);
    assert_eq!(pirate.versions[0].path, adapters.join("pirate/1"));
    assert_eq!(pirate.versions[1].path, adapters.join("pirate/2/p.gguf"));
    assert_eq!(pirate.latest().unwrap().version, "2");
    let problems = problem_text(&repo);
    assert!(
        problems.contains("pirate/3") && problems.contains("neither adapter_config.json"),
        "{problems}"
    );
    assert!(
        problems.contains("adapter 'other'") && problems.contains("name of a model"),
        "{problems}"
    );
}
