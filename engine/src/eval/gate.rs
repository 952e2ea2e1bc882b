//! Quality-gated rollouts: a model's `model.toml` may name a suite that a
//! version must pass before it becomes active.
//!
//! ```toml
//! [quality_gate]
//! suite = "gate.jsonl"   # relative to the model folder, or absolute
//! max_drop = 0.02        # accuracy points (as a fraction) below the active version
//! ```
//!
//! Activation refuses a version whose accuracy on the suite is more than
//! `max_drop` below the active version's ([`judge`]), unless forced. The
//! repository's `model.toml` parser only accepts the table; this module is
//! its one reader.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Summary;

/// A model's gate.
#[derive(Clone, Debug, PartialEq)]
pub struct QualityGate {
    /// The suite, resolved against the model folder.
    pub suite: PathBuf,
    pub max_drop: f64,
}

#[derive(Deserialize)]
struct RawFile {
    quality_gate: Option<RawGate>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGate {
    suite: PathBuf,
    #[serde(default = "default_max_drop")]
    max_drop: f64,
}

fn default_max_drop() -> f64 {
    0.02
}

/// The gate `model_dir/model.toml` names, if any. Errors name the file.
pub fn read_gate(model_dir: &Path) -> Result<Option<QualityGate>, String> {
    let path = model_dir.join("model.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    parse_gate(&text, model_dir).map_err(|reason| format!("{}: {reason}", path.display()))
}

/// The gate in `model.toml` text of the model at `model_dir`.
pub fn parse_gate(text: &str, model_dir: &Path) -> Result<Option<QualityGate>, String> {
    // The other keys are the repository parser's business.
    let raw: RawFile =
        toml::from_str(text).map_err(|e| format!("[quality_gate]: {}", e.message()))?;
    let Some(gate) = raw.quality_gate else {
        return Ok(None);
    };
    if !(0.0..=1.0).contains(&gate.max_drop) {
        return Err(format!(
            "[quality_gate] max_drop is {}; it is a fraction of accuracy between 0 and 1",
            gate.max_drop
        ));
    }
    Ok(Some(QualityGate {
        suite: model_dir.join(gate.suite),
        max_drop: gate.max_drop,
    }))
}

/// Why a version may not become active.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "{candidate_id} scores acc {candidate:.4} (n {n}) on the quality gate {suite}, more than \
     max_drop {max_drop} below the active {active_id}'s {active:.4}; activate with ?force=true \
     to override"
)]
pub struct GateRefusal {
    pub candidate_id: String,
    pub active_id: String,
    pub suite: String,
    pub candidate: f64,
    pub active: f64,
    pub max_drop: f64,
    pub n: usize,
}

/// Refuses `candidate` when its accuracy falls more than `max_drop` below `active`'s.
pub fn judge(
    gate: &QualityGate,
    candidate_id: &str,
    candidate: &Summary,
    active_id: &str,
    active: &Summary,
) -> Result<(), GateRefusal> {
    // A tiny epsilon keeps an exact max_drop (0.30 - 0.28 in floats) from refusing.
    if candidate.acc + gate.max_drop + 1e-9 >= active.acc {
        return Ok(());
    }
    Err(GateRefusal {
        candidate_id: candidate_id.to_string(),
        active_id: active_id.to_string(),
        suite: super::suite_name(&gate.suite),
        candidate: candidate.acc,
        active: active.acc,
        max_drop: gate.max_drop,
        n: candidate.n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_table_and_refuses_bad_values() {
        let dir = Path::new("/r/m");
        let gate = parse_gate(
            "aliases = [\"a\"]\n[quality_gate]\nsuite = \"g.jsonl\"\nmax_drop = 0.05\n",
            dir,
        )
        .unwrap()
        .unwrap();
        assert_eq!(gate.suite, Path::new("/r/m/g.jsonl"));
        assert_eq!(gate.max_drop, 0.05);
        assert_eq!(parse_gate("aliases = []\n", dir).unwrap(), None);
        let default = parse_gate("[quality_gate]\nsuite = \"/abs.jsonl\"\n", dir)
            .unwrap()
            .unwrap();
        assert_eq!(
            (default.suite.as_path(), default.max_drop),
            (Path::new("/abs.jsonl"), 0.02)
        );
        assert!(
            parse_gate("[quality_gate]\nsuite = \"g\"\nmax_drop = 2.0\n", dir)
                .unwrap_err()
                .contains("max_drop is 2")
        );
        assert!(parse_gate("[quality_gate]\nsuit = \"g\"\n", dir)
            .unwrap_err()
            .contains("suit"));
    }

    #[test]
    fn refuses_a_drop_beyond_max_drop_naming_both_figures() {
        let gate = QualityGate {
            suite: PathBuf::from("/e/geo.jsonl"),
            max_drop: 0.02,
        };
        let active = Summary::new(100, 60, 60);
        assert!(judge(&gate, "m@2", &Summary::new(100, 58, 58), "m@1", &active).is_ok());
        assert!(judge(&gate, "m@2", &Summary::new(100, 70, 70), "m@1", &active).is_ok());
        let refusal = judge(&gate, "m@2", &Summary::new(100, 57, 57), "m@1", &active).unwrap_err();
        let message = refusal.to_string();
        assert!(
            message.contains("0.5700") && message.contains("0.6000"),
            "{message}"
        );
        assert!(
            message.contains("geo") && message.contains("force"),
            "{message}"
        );
    }
}
