//! Policy files, validation, scoring, splits, budgets and hot reload. Knows nothing of HTTP.
