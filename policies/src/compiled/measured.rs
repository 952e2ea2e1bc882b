//! Resolving `quality_from`: each model that takes its quality from a suite gets the
//! measured accuracy of its active version, when a fresh one exists, and keeps a record
//! of where every figure came from for `policy explain`.
//!
//! Only fresh measurements route: a stale one (the suite or the checkpoint changed
//! since) could be far from the truth in either direction. Without one the file's
//! declared figure is used, and without that the model counts as quality 0, so that an
//! unmeasured model never outranks a measured one by accident.

use crate::compiled::model::{Model, QualityOrigin};
use crate::compiled::scan_table::ScanTable;
use crate::compiled::tags::TagTable;
use crate::compiled::CompiledPolicy;
use crate::measured::QualitySource;

/// Sets every `quality_from` model's figures from `source` and rebuilds the tables
/// routing reads them from. Idempotent: it starts from the declared figures each time.
pub(crate) fn resolve(compiled: &mut CompiledPolicy, source: &dyn QualitySource) {
    resolve_split_evals(compiled, source);
    let mut any = false;
    for model in &mut compiled.models {
        any |= resolve_model(model, source);
    }
    if any {
        compiled.tags = TagTable::new(&compiled.models);
        compiled.scan = ScanTable::new(&compiled.models);
    }
}

/// Compares the stored evaluations of every rollback rule's arms on its `eval_suite`
/// and notes on the split when the candidate's accuracy is below the baseline's by more
/// than `max_eval_drop` (both measurements fresh; a missing or stale one decides nothing).
fn resolve_split_evals(compiled: &mut CompiledPolicy, source: &dyn QualitySource) {
    let models = &compiled.models;
    for split in &mut compiled.splits {
        let verdict = split.rollback().and_then(|rule| {
            let eval = rule.eval.as_ref()?;
            let measure = |arm: usize| {
                let arm = split.arms.get(arm)?;
                let model = models.get(arm.model)?;
                let version = model.versions.get(arm.version)?;
                let measured = source
                    .measurement(&model.name, version, &eval.suite)
                    .fresh()?;
                Some((format!("{}@{version}", model.name), measured))
            };
            let (base_name, base) = measure(rule.baseline)?;
            let (cand_name, cand) = measure(rule.candidate)?;
            let drop = base.acc - cand.acc;
            (drop > eval.max_drop).then(|| {
                format!(
                    "accuracy of arm `{}` ({cand_name}) on `{}` is {:.3} (n {}) against {:.3} (n {}) on `{}` ({base_name}): a drop of {drop:.3}, allowed {}",
                    split.arms.get(rule.candidate).map_or("?", |a| &a.name),
                    eval.suite,
                    cand.acc,
                    cand.n,
                    base.acc,
                    base.n,
                    split.arms.get(rule.baseline).map_or("?", |a| &a.name),
                    eval.max_drop
                )
            })
        });
        split.eval_verdict = verdict;
    }
}

fn resolve_model(model: &mut Model, source: &dyn QualitySource) -> bool {
    let Some(from) = model.quality_from.as_mut() else {
        return false;
    };
    let Some(version) = model.versions.get(model.active_version).cloned() else {
        return false;
    };
    from.origins.clear();
    let mut overall = from.declared.unwrap_or(0.0);
    if let Some(suite) = &from.suite {
        let measurement = source.measurement(&model.name, &version, suite);
        let (used, basis) = match (measurement.fresh(), from.declared) {
            (Some(m), _) => (m.acc, "measured"),
            (None, Some(declared)) => (declared, "declared"),
            (None, None) => (0.0, "none"),
        };
        overall = used;
        from.origins.push(QualityOrigin {
            tag: None,
            suite: suite.clone(),
            version: version.clone(),
            measurement,
            used,
            basis,
        });
    }
    model.quality = overall;
    let mut by_tag = from.declared_by_tag.clone();
    for (tag, suite) in &from.by_tag {
        let measurement = source.measurement(&model.name, &version, suite);
        let declared = from
            .declared_by_tag
            .iter()
            .find(|(t, _)| t == tag)
            .map(|&(_, q)| q);
        let (used, basis) = match (measurement.fresh(), declared) {
            (Some(m), _) => (m.acc, "measured"),
            (None, Some(declared)) => (declared, "declared"),
            (None, None) => (overall, "overall"),
        };
        match by_tag.iter_mut().find(|(t, _)| t == tag) {
            Some(cell) => cell.1 = used,
            None => by_tag.push((tag.clone(), used)),
        }
        from.origins.push(QualityOrigin {
            tag: Some(tag.clone()),
            suite: suite.clone(),
            version: version.clone(),
            measurement,
            used,
            basis,
        });
    }
    // `Model::quality_for` and the tag table expect the per-tag list sorted by tag.
    by_tag.sort_by(|a, b| a.0.cmp(&b.0));
    model.quality_by_tag = by_tag;
    true
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use crate::measured::{Measured, Measurement, NoMeasurements, QualitySource};
    use crate::Policy;

    /// Measurements by `model@version/suite`; anything else is missing.
    #[derive(Debug, Default)]
    struct Table(Mutex<HashMap<String, Measurement>>);

    impl Table {
        fn set(&self, key: &str, m: Measurement) {
            self.0.lock().unwrap().insert(key.to_string(), m);
        }
    }

    impl QualitySource for Table {
        fn measurement(&self, model: &str, version: &str, suite: &str) -> Measurement {
            self.0
                .lock()
                .unwrap()
                .get(&format!("{model}@{version}/{suite}"))
                .cloned()
                .unwrap_or(Measurement::Missing {
                    why: "never measured".into(),
                })
        }

        fn fingerprint(&self) -> u64 {
            0
        }
    }

    fn fresh(acc: f64) -> Measurement {
        Measurement::Fresh {
            measured: Measured {
                acc,
                n: 200,
                ci95: [acc - 0.05, acc + 0.05],
            },
        }
    }

    const POLICY: &str = r#"
        [[models]]
        name = "small"
        versions = ["1", "2"]
        active_version = "2"
        cost_per_1k_input = 0.0
        cost_per_1k_output = 0.0
        quality = 0.5
        quality_from = "geo"
        quality_by_tag = { prose = 0.4 }
        quality_from_by_tag = { math = "arith-gen", prose = "strings" }
        context_limit = 100

        [[models]]
        name = "large"
        version = "1"
        cost_per_1k_input = 0.0
        cost_per_1k_output = 0.0
        quality_from = "geo"
        context_limit = 100
    "#;

    #[test]
    fn fresh_measurements_replace_declared_figures_per_tag_too() {
        let table = Table::default();
        table.set("small@2/geo", fresh(0.66));
        table.set("small@2/arith-gen", fresh(0.29));
        table.set("small@1/strings", fresh(0.9)); // another version: not used
        table.set("large@1/geo", fresh(0.7));
        let policy = Policy::from_toml_str(POLICY)
            .unwrap()
            .resolve_quality(&table);
        let small = &policy.models()[0];
        assert_eq!(small.quality, 0.66);
        assert_eq!(small.quality_for(&["math".into()]), (0.29, Some("math")));
        // No fresh `strings` figure for version 2: the declared per-tag figure stays.
        assert_eq!(small.quality_for(&["prose".into()]), (0.4, Some("prose")));
        let origins = &small.quality_from.as_ref().unwrap().origins;
        let bases: Vec<_> = origins
            .iter()
            .map(|o| (o.suite.as_str(), o.basis))
            .collect();
        assert_eq!(
            bases,
            [
                ("geo", "measured"),
                ("arith-gen", "measured"),
                ("strings", "declared")
            ]
        );
        assert_eq!(policy.models()[1].quality, 0.7);
        // The tables auto reads agree with the models.
        let ids = [policy.compiled.tags.id("math")];
        assert_eq!(policy.compiled.tags.quality(0, 0.66, &ids).0, 0.29);
        assert_eq!(&policy.compiled.scan.quality[..], &[0.66, 0.7]);
    }

    #[test]
    fn stale_or_missing_measurements_fall_back_and_say_so() {
        let table = Table::default();
        table.set(
            "small@2/geo",
            Measurement::Stale {
                measured: Measured {
                    acc: 0.99,
                    n: 10,
                    ci95: [0.6, 1.0],
                },
                why: "stale: the suite changed".into(),
            },
        );
        let policy = Policy::from_toml_str(POLICY)
            .unwrap()
            .resolve_quality(&table);
        let small = &policy.models()[0];
        assert_eq!(small.quality, 0.5, "a stale figure never routes");
        assert_eq!(
            small.quality_for(&["math".into()]).0,
            0.5,
            "a tag with nothing measured or declared takes the overall figure"
        );
        let large = &policy.models()[1];
        assert_eq!(large.quality, 0.0, "nothing measured, nothing declared: 0");
        assert_eq!(
            large.quality_from.as_ref().unwrap().origins[0].basis,
            "none"
        );
        // Resolving again with a fresh figure recovers it: declared values are kept.
        table.set("small@2/geo", fresh(0.6));
        let again = policy.resolve_quality(&table);
        assert_eq!(again.models()[0].quality, 0.6);
        let unresolved = Policy::from_toml_str(POLICY).unwrap();
        assert!(matches!(
            unresolved.models()[0]
                .quality_from
                .as_ref()
                .unwrap()
                .origins[0]
                .measurement,
            Measurement::Missing { .. }
        ));
        let _ = NoMeasurements;
    }

    #[test]
    fn a_model_needs_a_quality_or_a_suite() {
        let src = "[[models]]\nname = \"m\"\nversion = \"1\"\ncost_per_1k_input = 0.0\n\
                   cost_per_1k_output = 0.0\ncontext_limit = 10\n";
        let err = Policy::from_toml_str(src).unwrap_err().to_string();
        assert!(err.contains("has no quality"), "{err}");
        let bad = format!("{src}quality_from = \"evals/geo.jsonl\"\n");
        let err = Policy::from_toml_str(&bad).unwrap_err().to_string();
        assert!(err.contains("names a suite by its name"), "{err}");
    }

    #[test]
    fn a_split_rolls_back_when_the_candidates_stored_evaluation_drops() {
        let src = format!(
            "{POLICY}\n[[splits]]\nname = \"s\"\nmodel = \"small\"\narms = [{{ name = \"old\", target = \"small@1\", weight = 50 }}, {{ name = \"new\", target = \"small@2\", weight = 50 }}]\n[splits.rollback]\nbaseline = \"old\"\ncandidate = \"new\"\nwindow = \"5m\"\nmin_samples = 10\neval_suite = \"geo\"\nmax_eval_drop = 0.05\n"
        );
        let table = Table::default();
        table.set("small@1/geo", fresh(0.60));
        table.set("small@2/geo", fresh(0.57));
        let policy = Policy::from_toml_str(&src).unwrap().resolve_quality(&table);
        assert!(
            !policy.rollback_monitor("s").unwrap().is_rolled_back(),
            "0.03 is within 0.05"
        );
        // A missing record decides nothing.
        let policy = Policy::from_toml_str(&src)
            .unwrap()
            .resolve_quality(&NoMeasurements);
        assert!(!policy.rollback_monitor("s").unwrap().is_rolled_back());
        table.set("small@2/geo", fresh(0.50));
        let policy = Policy::from_toml_str(&src).unwrap().resolve_quality(&table);
        let status = policy.rollback_monitor("s").unwrap().status();
        let crate::RollbackState::RolledBack { signal, reason, .. } = status.state else {
            panic!("not rolled back: {status:?}");
        };
        assert_eq!(signal, "eval");
        assert_eq!(
            reason,
            "accuracy of arm `new` (small@2) on `geo` is 0.500 (n 200) against 0.600 (n 200) on `old` (small@1): a drop of 0.100, allowed 0.05"
        );
    }
}
