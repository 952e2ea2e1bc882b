//! Issue 17, case 4: a budget reservation covers the most a request can spend, every
//! generation (prompts × `n`) to its `max_tokens` or to the end of the context, so a
//! 300-token budget cannot be overspent by one request.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

mod common;

use common::policy;
use switchyard_policies::{route, Caller, IdleEngine, ModelHint, RouteErrorKind, RouteRequest};

const BUDGETED: &str = r#"
[[models]]
name = "small"
version = "v1"
cost_per_1k_input = 1.0
cost_per_1k_output = 1.0
quality = 0.5
context_limit = 200
[[tenants]]
name = "t"
api_keys = ["env:TEST_KEY"]
[[tenants.budgets]]
window = "5200w"
limit_tokens = 300
"#;

fn request(generations: u32, max_tokens: Option<u32>) -> RouteRequest {
    let mut req = RouteRequest::new(ModelHint::parse("small"), Caller::Tenant("t".into()));
    req.prompt_tokens = 10;
    req.max_output_tokens = max_tokens;
    req.generations = generations;
    req
}

#[test]
fn every_generation_is_reserved() {
    let p = policy(BUDGETED);
    // 4 generations × (10 + 60) = 280 fits the 300 tokens.
    let fits = route(&p, &request(4, Some(60)), &IdleEngine).unwrap();
    assert_eq!(fits.reservation.estimate().tokens, 280);
    drop(fits);
    // 16 generations × 70 = 1,120: one generation's 70 used to be all that was held.
    let err = route(&p, &request(16, Some(60)), &IdleEngine).unwrap_err();
    assert_eq!(err.kind(), RouteErrorKind::BudgetExhausted, "{err}");
    let snapshot = p.budgets("t").unwrap()[0].snapshot();
    assert_eq!((snapshot.settled, snapshot.reserved), (0.0, 0.0));
}

#[test]
fn without_max_tokens_the_reservation_runs_to_the_end_of_the_context() {
    let p = policy(BUDGETED);
    // Without max_tokens a generation may run to the 200-token context: 200 held.
    let one = route(&p, &request(1, None), &IdleEngine).unwrap();
    assert_eq!(one.reservation.estimate().tokens, 200);
    // A second one would hold 400 of 300.
    let err = route(&p, &request(1, None), &IdleEngine).unwrap_err();
    assert_eq!(err.kind(), RouteErrorKind::BudgetExhausted, "{err}");
    drop(one);
    // max_tokens past the context is held only up to the context.
    let capped = route(&p, &request(1, Some(5_000)), &IdleEngine);
    // 10 + 5,000 does not fit a 200-token context at all: refused as too long.
    assert!(capped.is_err());
}
