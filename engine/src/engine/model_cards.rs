//! The served models as `GET /v1/models` lists them: each model by name (its
//! active version) and each resident `name@version`.

use switchyard_kernels::Backend;
use switchyard_seam::{CheckpointRef, ModelCard, ModelSpec};

use crate::registry::{ModelStatus, Registry};
use crate::serving::ServedCheckpoint;

pub(super) fn model_cards<B: Backend>(registry: &Registry<B>, created: u64) -> Vec<ModelCard> {
    let card = |id: String, checkpoint: &ServedCheckpoint<B>| ModelCard {
        id,
        created,
        owned_by: "switchyard".into(),
        context_length: u32::try_from(checkpoint.model.config().context_length).unwrap_or(u32::MAX),
        parent: checkpoint.parent.clone(),
    };
    let mut cards = Vec::new();
    for model in registry.status() {
        let Ok(active) = registry.resolve(&model.name) else {
            // An adapter the budget evicted is still served (a request loads
            // it again): listed with its base's context window.
            if let Some(card) = evicted_adapter_card(registry, &model, created) {
                cards.push(card);
            }
            continue;
        };
        cards.push(card(model.name.clone(), &active));
        for version in model.versions.iter().filter(|v| v.tier.is_resident()) {
            let spec = ModelSpec::from(CheckpointRef::new(&model.name, &version.version));
            if let Ok(checkpoint) = registry.resolve_spec(&spec) {
                cards.push(card(spec.to_string(), &checkpoint));
            }
        }
    }
    cards
}

/// The card of `model` when its active version is an adapter evicted by the
/// adapter budget.
fn evicted_adapter_card<B: Backend>(
    registry: &Registry<B>,
    model: &ModelStatus,
    created: u64,
) -> Option<ModelCard> {
    let active = model.active_version.as_deref()?;
    let version = model.versions.iter().find(|v| v.version == active)?;
    let parent = version.parent.clone().filter(|_| version.evicted)?;
    let base = registry.resolve(&parent).ok()?;
    Some(ModelCard {
        id: model.name.clone(),
        created,
        owned_by: "switchyard".into(),
        context_length: u32::try_from(base.model.config().context_length).unwrap_or(u32::MAX),
        parent: Some(parent),
    })
}
