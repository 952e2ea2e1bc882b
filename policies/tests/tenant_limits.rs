//! A tenant's rate limits and prompt-cache scope: validated with their line, compiled,
//! counted per tenant and per key, explained.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use common::{assert_diag_at, diagnostics, policy};
use switchyard_policies::{
    explain, key_digest, Caller, IdleEngine, LocalRateLedger, ModelHint, RateLedger, RateSubject,
    RouteRequest,
};
use switchyard_seam::CacheScope;

fn policy_src(tenant_extra: &str) -> String {
    format!(
        r#"
[[models]]
name = "m"
version = "v1"
cost_per_1k_input = 0.1
cost_per_1k_output = 0.2
quality = 0.5
context_limit = 1000

[[tenants]]
name = "a"
api_keys = ["env:TEST_KEY", "env:SWITCHYARD_BATCH_KEY"]
{tenant_extra}
"#
    )
}

#[test]
fn limits_must_be_whole_numbers_above_zero_and_set_something() {
    let src = policy_src(
        "rate_limits = { requests_per_minute = 0, tokens_per_minute = 10 }\nkey_rate_limits = {}\n",
    );
    let d = diagnostics(&src);
    assert_diag_at(
        &d,
        &src,
        "0, tokens",
        "rate_limits.requests_per_minute must be above 0",
    );
    assert!(
        d.iter()
            .any(|d| d.message.contains("key_rate_limits sets no limit")),
        "{d:?}"
    );
    let src = policy_src("rate_limits = { requests_per_mintue = 5 }\n");
    assert!(diagnostics(&src)[0].message.contains("requests_per_mintue"));
    let src = policy_src("cache_scope = \"two words\"\n");
    assert_diag_at(&diagnostics(&src), &src, "\"two words\"", "cache_scope");
}

#[test]
fn a_request_is_claimed_against_its_tenant_and_its_own_key() {
    let p = policy(&policy_src(
        "rate_limits = { requests_per_minute = 3 }\nkey_rate_limits = { tokens_per_minute = 500 }\n",
    ));
    let claims = p.rate_claims(&Caller::ApiKey("sk-test".into()), 200);
    let subjects: Vec<&RateSubject> = claims.iter().map(|c| &c.subject).collect();
    assert_eq!(
        subjects,
        [
            &RateSubject::Tenant("a".into()),
            &RateSubject::Key(key_digest("sk-test"))
        ]
    );
    assert!(p.rate_claims(&Caller::Anonymous, 200).is_empty());
    assert!(p
        .rate_claims(&Caller::ApiKey("sk-unknown".into()), 1)
        .is_empty());
    // Two keys of one tenant: each has its own token window, the tenant one count.
    let ledger = LocalRateLedger::default();
    let a2 = p.rate_claims(&Caller::ApiKey("sk-batch-demo".into()), 300);
    let a1 = p.rate_claims(&Caller::ApiKey("sk-test".into()), 300);
    assert!(ledger.take(&a1, 0).allowed);
    assert!(!ledger.take(&a1, 1).allowed, "key a1 has 200 tokens left");
    let d = ledger.take(&a2, 2);
    assert!(d.allowed);
    assert_eq!(d.requests.map(|q| q.remaining), Some(1));
}

#[test]
fn explain_says_the_limits_and_the_cache_scope() {
    let p = policy(&policy_src(
        "rate_limits = { requests_per_minute = 60 }\ncache_scope = \"team\"\n",
    ));
    assert_eq!(p.tenants()[0].cache_scope, CacheScope::shared("team"));
    let req = RouteRequest::new(ModelHint::parse("m"), Caller::ApiKey("sk-test".into()));
    let out = explain(&p, &req, &IdleEngine);
    assert_eq!(
        out.rate_limits.as_deref(),
        Some("tenant: 60 requests/min; each key: none")
    );
    assert_eq!(out.cache_scope, "shared:team");
    assert!(out.to_string().contains(
        "rate limits: tenant: 60 requests/min; each key: none; prompt cache scope: shared:team"
    ));
    let plain = policy(&policy_src(""));
    assert_eq!(plain.tenants()[0].cache_scope, CacheScope::tenant("a"));
}

/// Issue 32: a tenant's part of the engine's KV budget and queue (`kv_share`):
/// validated with its line; by default half once two callers can compete, all
/// of it for a policy of one tenant.
#[test]
fn kv_share_is_a_part_of_the_budget_with_a_default_for_several_callers() {
    let src = policy_src("kv_share = 1.5\n");
    assert_diag_at(&diagnostics(&src), &src, "1.5", "kv_share must be above 0");
    let src = policy_src("kv_share = -0.5\n");
    assert_diag_at(&diagnostics(&src), &src, "-0.5", "kv_share must be above 0");

    let alone = policy(&policy_src(""));
    assert_eq!(alone.kv_permille(Some("a")), 1000);
    let own = policy(&policy_src("kv_share = 0.25\n"));
    assert_eq!(own.kv_permille(Some("a")), 250);
    let two = policy(&format!(
        "{}\n[[tenants]]\nname = \"b\"\nkv_share = 0.75\n",
        policy_src("")
    ));
    assert_eq!(two.kv_permille(Some("a")), 500);
    assert_eq!(two.kv_permille(Some("b")), 750);
    // Anonymous callers beside one tenant: half each.
    let anonymous = policy(&policy_src("").replace(
        "[[models]]",
        "[routing]\nallow_anonymous = true\n\n[[models]]",
    ));
    assert_eq!(anonymous.kv_permille(None), 500);
    assert_eq!(anonymous.kv_permille(Some("a")), 500);
}
