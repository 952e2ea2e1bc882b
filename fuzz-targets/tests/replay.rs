//! Every target over its seeds, its saved regressions (crashes fuzzing found, kept as
//! inputs) and a fixed run of mutations: what `fuzz-replay` does, deterministic and
//! short enough for the test command.

use std::path::Path;

use switchyard_fuzz_targets::mutate::{mutate, Rng};
use switchyard_fuzz_targets::{seeds::seeds, TARGETS};

const MUTATIONS: usize = 1_500;

#[test]
fn every_target_survives_its_seeds_regressions_and_mutations() {
    let regressions = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    for (name, check) in TARGETS {
        let mut corpus = seeds(name);
        assert!(!corpus.is_empty(), "{name} has seeds");
        if let Ok(entries) = std::fs::read_dir(regressions.join(name)) {
            for entry in entries.filter_map(Result::ok) {
                corpus.push(std::fs::read(entry.path()).expect("a regression input reads"));
            }
        }
        for input in &corpus {
            check(input);
        }
        let mut rng = Rng::new(0x5eed ^ name.len() as u64);
        for _ in 0..MUTATIONS {
            let base = &corpus[rng.below(corpus.len())];
            let other = &corpus[rng.below(corpus.len())];
            check(&mutate(base, other, &mut rng, 65_536));
        }
    }
}

#[test]
fn the_seeds_are_accepted_where_they_should_be() {
    // Seeds that the parser refuses would leave the mutations exploring error paths only.
    use switchyard_engine::formats::gguf::GgufFile;
    let gguf = &seeds("gguf_reader")[0];
    let file = GgufFile::parse(gguf).expect("the GGUF seed parses");
    assert_eq!(file.tensors().len(), 2);
    for policy in seeds("policy_toml") {
        let text = String::from_utf8(policy).expect("policies are UTF-8");
        assert!(
            switchyard_policies::Policy::from_toml_str_with_env(&text, "p.toml", &|_| {
                Some(switchyard_fuzz_targets::FUZZ_KEY.to_owned())
            })
            .is_ok()
        );
    }
}
