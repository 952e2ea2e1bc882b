//! `[cascade]`: at least two distinct models, a known statistic, a threshold on that
//! statistic's scale.

use toml::Spanned;

use super::names::Names;
use crate::compiled::cascade::{Cascade, Statistic};
use crate::error::Diagnostics;
use crate::schema::CascadeEntry;

/// The statistic used when the file names none: Gupta et al. found low quantiles the
/// most telling.
const DEFAULT_STATISTIC: Statistic = Statistic::Quantile(1);

pub(super) fn cascade(
    entry: Option<&Spanned<CascadeEntry>>,
    names: &Names,
    diags: &mut Diagnostics,
) -> Option<Cascade> {
    let entry = entry?;
    let e = entry.get_ref();
    let mut models = Vec::new();
    for name in e.models.get_ref() {
        match names.model(name.get_ref()) {
            Ok(m) if models.contains(&m) => diags.at(
                name.span(),
                format!("cascade: model `{}` is listed twice", name.get_ref()),
            ),
            Ok(m) => models.push(m),
            Err(message) => diags.at(name.span(), format!("cascade: {message}")),
        }
    }
    if e.models.get_ref().len() < 2 {
        diags.at(
            e.models.span(),
            "cascade: list at least two models, cheapest first (the first answers, the next takes what it defers)",
        );
    }
    let statistic = match &e.confidence {
        None => DEFAULT_STATISTIC,
        Some(name) => Statistic::parse(name.get_ref()).unwrap_or_else(|| {
            diags.at(
                name.span(),
                format!(
                    "cascade: confidence `{}` is not one of {}",
                    name.get_ref(),
                    Statistic::NAMES.join(", ")
                ),
            );
            DEFAULT_STATISTIC
        }),
    };
    let min = *e.min_confidence.get_ref();
    if let Some(error) = statistic.threshold_error(min) {
        diags.at(e.min_confidence.span(), format!("cascade: {error}"));
    }
    let handoff = e.handoff.as_ref().is_some_and(|h| *h.get_ref());
    if let Some(h) = e.handoff.as_ref().filter(|h| *h.get_ref()) {
        if statistic != Statistic::MinMargin {
            diags.at(
                h.span(),
                format!(
                    "cascade: handoff needs confidence = \"min_margin\" (the stop that ends an answer at its first unsure token), not `{statistic}`"
                ),
            );
        }
    }
    Some(Cascade {
        models,
        statistic,
        min_confidence: min,
        handoff,
    })
}
