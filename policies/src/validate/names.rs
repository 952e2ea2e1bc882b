//! Model lookup by name, alias or `name@version`, shared by the tenant, split and
//! fallback checks.

use std::collections::HashMap;

use crate::compiled::model::{Model, Target};

/// Model lookup shared by the tenant, split and fallback checks.
pub(super) struct Names<'a> {
    pub models: &'a [Model],
    pub index: &'a HashMap<Box<str>, usize>,
}

impl Names<'_> {
    /// A model by name or alias, or an error listing the known names.
    pub fn model(&self, name: &str) -> Result<usize, String> {
        self.index.get(name).copied().ok_or_else(|| {
            let mut known: Vec<&str> = self.models.iter().map(|m| &*m.name).collect();
            known.sort_unstable();
            format!(
                "unknown model `{name}`; define it under [[models]] or use one of: {}",
                known.join(", ")
            )
        })
    }

    /// `name`, `alias` or `name@version`.
    pub fn target(&self, spec: &str) -> Result<Target, String> {
        let Some((name, version)) = spec.split_once('@') else {
            return Ok(Target {
                model: self.model(spec)?,
                version: None,
            });
        };
        let model = self.model(name)?;
        let versions = self.models.get(model).map_or(&[][..], |m| &m.versions[..]);
        match versions.iter().position(|v| &**v == version) {
            Some(v) => Ok(Target {
                model,
                version: Some(v),
            }),
            None => Err(format!(
                "model `{name}` has no version `{version}`; its versions are: {}",
                versions.iter().map(|v| &**v).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// The concrete version a target resolves to when no split applies.
    pub fn version_of(&self, target: Target) -> usize {
        target.version.unwrap_or_else(|| {
            self.models
                .get(target.model)
                .map_or(0, |m| m.active_version)
        })
    }
}
