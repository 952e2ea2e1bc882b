//! Per-tag quality as a table, built once per policy, so that scoring a candidate under a
//! request's tags reads numbers by index instead of comparing tag strings per model.

use std::collections::HashMap;

use crate::compiled::model::Model;

/// Every tag any model scores, and each model's quality under each of them.
#[derive(Debug, Default)]
pub(crate) struct TagTable {
    ids: HashMap<Box<str>, usize>,
    /// `quality[model * tag_count + tag]`: the model's quality for the tag, or its
    /// overall quality when it lists none for that tag (as [`Model::quality_for`]).
    quality: Vec<f64>,
}

impl TagTable {
    pub(crate) fn new(models: &[Model]) -> Self {
        let mut ids: HashMap<Box<str>, usize> = HashMap::new();
        for m in models {
            for (tag, _) in &m.quality_by_tag {
                let next = ids.len();
                ids.entry(tag.as_str().into()).or_insert(next);
            }
        }
        let count = ids.len();
        let mut quality = Vec::with_capacity(models.len() * count);
        for m in models {
            let row = quality.len();
            quality.resize(row + count, m.quality);
            for (tag, q) in &m.quality_by_tag {
                if let Some(cell) = ids
                    .get(tag.as_str())
                    .and_then(|&t| quality.get_mut(row + t))
                {
                    *cell = *q;
                }
            }
        }
        TagTable { ids, quality }
    }

    /// The id of `tag`, if any model scores it.
    pub(crate) fn id(&self, tag: &str) -> Option<usize> {
        self.ids.get(tag).copied()
    }

    /// The quality of `model` (an index) under the tag ids `tags` (`None`: a tag no model
    /// scores), the weakest one winning, as [`Model::quality_for`]; with the position in
    /// `tags` of the tag that set it. `overall` is the model's overall quality.
    pub(crate) fn quality(
        &self,
        model: usize,
        overall: f64,
        tags: &[Option<usize>],
    ) -> (f64, Option<usize>) {
        let row = model * self.ids.len();
        let mut best: Option<(f64, usize)> = None;
        for (i, id) in tags.iter().enumerate() {
            let q = id
                .and_then(|t| self.quality.get(row + t))
                .copied()
                .unwrap_or(overall);
            if best.is_none_or(|(b, _)| q < b) {
                best = Some((q, i));
            }
        }
        match best {
            Some((q, i)) => (q, Some(i)),
            None => (overall, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Policy;
    use proptest::prelude::*;

    fn policy(models: &[(f64, Vec<(&str, f64)>)]) -> Policy {
        let mut src = String::new();
        for (i, (quality, tags)) in models.iter().enumerate() {
            let tags: Vec<String> = tags.iter().map(|(t, q)| format!("{t} = {q:?}")).collect();
            src.push_str(&format!(
                "[[models]]\nname = \"m{i}\"\nversion = \"v1\"\ncost_per_1k_input = 0.0\n\
                 cost_per_1k_output = 0.0\nquality = {quality:?}\ncontext_limit = 100\n\
                 quality_by_tag = {{ {} }}\n",
                tags.join(", ")
            ));
        }
        Policy::from_toml_str(&src).expect("test policy is valid")
    }

    const TAGS: [&str; 4] = ["code", "math", "chat", "prose"];

    proptest! {
        /// The table answers exactly as the string scan it replaces, for any tags asked
        /// (known, unknown, repeated) and any per-model scores.
        #[test]
        fn table_matches_model_quality_for(
            models in prop::collection::vec(
                (0u8..=100, prop::collection::vec((0usize..3, 0u8..=100), 0..3)),
                1..5,
            ),
            asked in prop::collection::vec(0usize..4, 0..5),
        ) {
            let models: Vec<(f64, Vec<(&str, f64)>)> = models
                .into_iter()
                .map(|(q, tags)| {
                    let mut tags: Vec<(&str, f64)> = tags
                        .into_iter()
                        .map(|(t, q)| (TAGS[t], f64::from(q) / 100.0))
                        .collect();
                    tags.sort_by(|a, b| a.0.cmp(b.0));
                    tags.dedup_by(|a, b| a.0 == b.0);
                    (f64::from(q) / 100.0, tags)
                })
                .collect();
            let policy = policy(&models);
            let asked: Vec<String> = asked.iter().map(|&t| TAGS[t].to_string()).collect();
            let ids: Vec<Option<usize>> = asked.iter().map(|t| policy.compiled.tags.id(t)).collect();
            for (i, m) in policy.models().iter().enumerate() {
                let (q, tag) = m.quality_for(&asked);
                let (fast, at) = policy.compiled.tags.quality(i, m.quality, &ids);
                prop_assert_eq!(q, fast);
                prop_assert_eq!(tag, at.map(|i| asked[i].as_str()));
            }
        }
    }
}
