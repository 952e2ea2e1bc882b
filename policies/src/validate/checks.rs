//! The checks every section shares: names, number ranges and window lengths, each
//! reporting its problem at the value's line and column.

use toml::Spanned;

use crate::error::Diagnostics;

/// Checks a name used for models, aliases, versions, tenants, splits and arms.
pub(super) fn check_name(name: &Spanned<String>, what: &str, diags: &mut Diagnostics) -> bool {
    let n = name.get_ref();
    let problem = if n.is_empty() {
        Some("must not be empty".to_string())
    } else if n.contains('@') || n.contains(char::is_whitespace) || n.contains(',') {
        Some(format!("`{n}` must not contain `@`, `,` or whitespace"))
    } else if n.eq_ignore_ascii_case("auto") {
        Some("`auto` is reserved for automatic routing; pick another name".to_string())
    } else {
        None
    };
    if let Some(p) = &problem {
        diags.at(name.span(), format!("{what}: {p}"));
    }
    problem.is_none()
}

/// Checks `v >= 0` and finite.
pub(super) fn non_negative(v: &Spanned<f64>, field: &str, diags: &mut Diagnostics) -> bool {
    let x = *v.get_ref();
    let ok = x.is_finite() && x >= 0.0;
    if !ok {
        diags.at(
            v.span(),
            format!("{field} must be a finite number of 0 or more, got {x}"),
        );
    }
    ok
}

/// Checks `lo <= v <= hi`.
pub(super) fn in_range(
    v: &Spanned<f64>,
    lo: f64,
    hi: f64,
    field: &str,
    diags: &mut Diagnostics,
) -> bool {
    let x = *v.get_ref();
    let ok = (lo..=hi).contains(&x);
    if !ok {
        diags.at(
            v.span(),
            format!("{field} must lie between {lo} and {hi}, got {x}"),
        );
    }
    ok
}

/// Checks `v > 0` and finite.
pub(super) fn positive(v: &Spanned<f64>, field: &str, diags: &mut Diagnostics) -> bool {
    let x = *v.get_ref();
    let ok = x.is_finite() && x > 0.0;
    if !ok {
        diags.at(
            v.span(),
            format!("{field} must be a finite number above 0, got {x}"),
        );
    }
    ok
}

/// Parses a window such as `90s`, `15m`, `1h`, `1d` or `1w` into seconds.
pub(super) fn window_secs(
    w: &Spanned<String>,
    field: &str,
    diags: &mut Diagnostics,
) -> Option<u64> {
    let text = w.get_ref().trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let scale = match unit {
        "s" => Some(1),
        "m" => Some(60),
        "h" => Some(3600),
        "d" => Some(86_400),
        "w" => Some(604_800),
        _ => None,
    };
    match (digits.parse::<u64>(), scale) {
        (Ok(n), Some(scale)) if n > 0 => n.checked_mul(scale).or_else(|| {
            diags.at(w.span(), format!("{field} `{text}` is too long"));
            None
        }),
        _ => {
            diags.at(
                w.span(),
                format!("{field} `{text}` is not a window; write a whole number and a unit: s, m, h, d or w (e.g. `1h`)"),
            );
            None
        }
    }
}
