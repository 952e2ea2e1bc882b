//! Why routing chose a checkpoint: the `reason` of a route and of its metric label.

use serde::Serialize;

/// Why a checkpoint was chosen (also the `reason` metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteReason {
    /// `auto`: best utility among qualifying models.
    Auto,
    /// The model was named.
    Named,
    /// The model was reached through an alias.
    Alias,
    /// `name@version` was requested.
    Pinned,
    /// A split arm was assigned.
    Split,
    /// The split's rollback rule pinned traffic to its baseline arm.
    RolledBack,
    /// The requested model could not serve; a fallback did.
    Fallback,
}

impl RouteReason {
    /// A stable lower-case label.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::Auto => "auto",
            RouteReason::Named => "named",
            RouteReason::Alias => "alias",
            RouteReason::Pinned => "pinned",
            RouteReason::Split => "split",
            RouteReason::RolledBack => "rolled_back",
            RouteReason::Fallback => "fallback",
        }
    }
}
