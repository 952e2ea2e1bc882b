//! Property tests against an independent oracle: the pick never breaks a constraint, it
//! has the best utility among those that qualify, split shares converge to their weights,
//! sticky assignment is stable, and budgets are never overspent under concurrency.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::fmt::Write as _;
use std::sync::Arc;

use proptest::prelude::*;
use switchyard_policies::{
    route, Caller, CandidateState, Completion, ModelHint, Policy, PolicyStore, RouteRequest,
    StaticEngineView, Usage,
};

#[derive(Debug, Clone)]
struct GenModel {
    cost_in: u32,
    cost_out: u32,
    quality: u32,
    code_quality: Option<u32>,
    context: u32,
    latency_target: Option<u32>,
    max_queue: Option<u32>,
    state: CandidateState,
}

#[derive(Debug, Clone)]
struct GenRequest {
    min_quality: Option<u32>,
    max_cost: Option<u32>,
    max_latency: Option<u32>,
    code_tag: bool,
    prompt: u32,
    max_out: Option<u32>,
    allowed: Vec<bool>,
    budget: u32,
    weights: (u32, u32, u32),
}

fn state() -> impl Strategy<Value = CandidateState> {
    (
        any::<bool>(),
        0u32..10,
        0u32..2000,
        0u32..3000,
        0u32..20,
        prop::bool::weighted(0.9),
    )
        .prop_map(
            |(resident, queue_depth, wait, swap, per_token, healthy)| CandidateState {
                resident,
                queue_depth,
                est_queue_wait_ms: f64::from(wait),
                est_swap_or_load_ms: f64::from(swap),
                est_ms_per_token: f64::from(per_token) / 4.0,
                healthy,
            },
        )
}

fn model() -> impl Strategy<Value = GenModel> {
    (
        0u32..500,
        0u32..1500,
        0u32..=100,
        prop::option::of(0u32..=100),
        (1u32..8, 1u32..4000),
        prop::option::weighted(0.5, 100u32..30_000),
        prop::option::weighted(0.5, 1u32..10),
        state(),
    )
        .prop_map(
            |(
                cost_in,
                cost_out,
                quality,
                code_quality,
                (k, extra),
                latency_target,
                max_queue,
                state,
            )| {
                GenModel {
                    cost_in,
                    cost_out,
                    quality,
                    code_quality,
                    context: k * 1024 + extra,
                    latency_target,
                    max_queue,
                    state,
                }
            },
        )
}

fn request(n: usize) -> impl Strategy<Value = GenRequest> {
    (
        prop::option::weighted(0.5, 0u32..=100),
        prop::option::weighted(0.4, 0u32..2000),
        prop::option::weighted(0.4, 100u32..60_000),
        any::<bool>(),
        0u32..6000,
        prop::option::of(1u32..3000),
        prop::collection::vec(prop::bool::weighted(0.9), n),
        1u32..30_000,
        (0u32..4, 0u32..2000, 0u32..50),
    )
        .prop_map(
            |(
                min_quality,
                max_cost,
                max_latency,
                code_tag,
                prompt,
                max_out,
                allowed,
                budget,
                weights,
            )| {
                GenRequest {
                    min_quality,
                    max_cost,
                    max_latency,
                    code_tag,
                    prompt,
                    max_out,
                    allowed,
                    budget,
                    weights,
                }
            },
        )
}

// Costs are in units of 1e-5, quality in hundredths, weights as below; the oracle uses
// the very same f64 values the file spells (Display of an f64 parses back exactly).
fn cost(units: u32) -> f64 {
    f64::from(units) / 1e5
}
fn frac(hundredths: u32) -> f64 {
    f64::from(hundredths) / 100.0
}
fn weights(w: (u32, u32, u32)) -> (f64, f64, f64) {
    (
        f64::from(w.0) / 2.0,
        f64::from(w.1),
        f64::from(w.2) / 10_000.0,
    )
}

fn policy_toml(models: &[GenModel], req: &GenRequest) -> String {
    let (wq, wc, wl) = weights(req.weights);
    let mut s = format!(
        "[routing]\nquality_weight = {wq:?}\ncost_weight = {wc:?}\nlatency_weight = {wl:?}\nassumed_output_tokens = 300\n"
    );
    for (i, m) in models.iter().enumerate() {
        let _ = write!(
            s,
            "[[models]]\nname = \"m{i:02}\"\nversion = \"v1\"\ncost_per_1k_input = {:?}\ncost_per_1k_output = {:?}\nquality = {:?}\ncontext_limit = {}\n",
            cost(m.cost_in), cost(m.cost_out), frac(m.quality), m.context
        );
        if let Some(q) = m.code_quality {
            let _ = writeln!(s, "quality_by_tag = {{ code = {:?} }}", frac(q));
        }
        if let Some(t) = m.latency_target {
            let _ = writeln!(s, "latency_target_ms = {t}.0");
        }
        if let Some(q) = m.max_queue {
            let _ = writeln!(s, "max_queue_depth = {q}");
        }
    }
    let allowed: Vec<String> = (0..models.len())
        .filter(|&i| req.allowed[i])
        .map(|i| format!("\"m{i:02}\""))
        .collect();
    let _ = write!(
        s,
        "[[tenants]]\nname = \"t\"\nallowed_models = [{}]\n[[tenants.budgets]]\nwindow = \"5200w\"\nlimit_tokens = {}\n",
        allowed.join(", "),
        req.budget
    );
    s
}

fn engine(models: &[GenModel]) -> StaticEngineView {
    let mut v = StaticEngineView::default();
    for (i, m) in models.iter().enumerate() {
        v.checkpoints.insert(format!("m{i:02}@v1"), m.state);
    }
    v
}

fn route_request(req: &GenRequest, model: ModelHint) -> RouteRequest {
    let mut r = RouteRequest::new(model, Caller::Tenant("t".into()));
    r.hints.min_quality = req.min_quality.map(frac);
    r.hints.max_cost = req.max_cost.map(cost);
    r.hints.max_latency_ms = req.max_latency.map(f64::from);
    if req.code_tag {
        r.hints.tags = vec!["code".into()];
    }
    r.prompt_tokens = req.prompt;
    r.max_output_tokens = req.max_out;
    r
}

/// The oracle: does model `m` (index `i`) qualify, and its utility.
fn oracle(i: usize, m: &GenModel, req: &GenRequest) -> (bool, f64) {
    let out = f64::from(req.max_out.unwrap_or(300));
    let prompt = f64::from(req.prompt);
    let quality = if req.code_tag {
        frac(m.code_quality.unwrap_or(m.quality))
    } else {
        frac(m.quality)
    };
    let c = prompt / 1000.0 * cost(m.cost_in) + out / 1000.0 * cost(m.cost_out);
    let s = &m.state;
    let latency = if s.resident {
        0.0
    } else {
        s.est_swap_or_load_ms
    } + s.est_queue_wait_ms
        + out * s.est_ms_per_token;
    let tokens = prompt + out;
    // The reservation holds the worst case: to max_tokens, or to the end of the context.
    let context = f64::from(m.context);
    let held = prompt.min(context);
    let worst = held
        + req
            .max_out
            .map_or(context - held, |o| f64::from(o).min(context - held));
    let latency_limit = match (
        req.max_latency.map(f64::from),
        m.latency_target.map(f64::from),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let ok = req.allowed[i]
        && req.min_quality.is_none_or(|f| quality >= frac(f))
        && req.max_cost.is_none_or(|x| c <= cost(x))
        && tokens <= f64::from(req.budget)
        && worst <= f64::from(req.budget)
        && u64::from(req.prompt) + u64::from(req.max_out.unwrap_or(0)) <= u64::from(m.context)
        && s.healthy
        && m.max_queue.is_none_or(|q| s.queue_depth < q)
        && latency_limit.is_none_or(|l| latency <= l);
    let (wq, wc, wl) = weights(req.weights);
    let term = |w: f64, x: f64| if w == 0.0 { 0.0 } else { w * x };
    (ok, wq * quality - term(wc, c) - term(wl, latency))
}

fn models_and_request() -> impl Strategy<Value = (Vec<GenModel>, GenRequest)> {
    models_and_request_of(1..12)
}

fn models_and_request_of(
    count: std::ops::Range<usize>,
) -> impl Strategy<Value = (Vec<GenModel>, GenRequest)> {
    prop::collection::vec(model(), count).prop_flat_map(|models| {
        let n = models.len();
        (Just(models), request(n))
    })
}

/// Under `auto`: the pick qualifies, no qualifying model beats it, and the explanation
/// counts exactly the models that qualify; a refusal only when none does.
fn check_auto_pick(
    policy: &Policy,
    engine: &StaticEngineView,
    req: &GenRequest,
    verdicts: &[(bool, f64)],
) -> Result<(), TestCaseError> {
    match route(policy, &route_request(req, ModelHint::Auto), engine) {
        Ok(r) => {
            let picked: usize = r.model[1..].parse().unwrap();
            let (ok, utility) = verdicts[picked];
            prop_assert!(ok, "pick m{picked:02} breaks a constraint");
            for (i, &(q, u)) in verdicts.iter().enumerate() {
                if q {
                    prop_assert!(
                        u < utility || (u == utility && i >= picked),
                        "m{i:02} (utility {u}) beats the pick m{picked:02} ({utility})"
                    );
                }
            }
            let qualifying = verdicts.iter().filter(|v| v.0).count();
            let counted = format!(" of {qualifying} qualifying ");
            prop_assert!(
                r.explanation.contains(&counted),
                "{} should say{counted}",
                r.explanation
            );
        }
        Err(e) => prop_assert!(
            verdicts.iter().all(|v| !v.0),
            "refused although some qualify: {e}"
        ),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_pick_qualifies_and_has_the_best_utility((models, req) in models_and_request()) {
        let policy = Policy::from_toml_str(&policy_toml(&models, &req)).unwrap();
        let engine = engine(&models);
        let verdicts: Vec<(bool, f64)> = models.iter().enumerate().map(|(i, m)| oracle(i, m, &req)).collect();
        check_auto_pick(&policy, &engine, &req, &verdicts)?;
        // A named model routes exactly when it qualifies (no splits or fallbacks here).
        for (i, &(ok, _)) in verdicts.iter().enumerate() {
            let named = route(&policy, &route_request(&req, ModelHint::parse(&format!("m{i:02}"))), &engine);
            prop_assert_eq!(named.is_ok(), ok);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The same with more models than one block of the `auto` scan (64): blocks, their
    /// ends and the models past them are checked as the first ones. (Names stay two
    /// digits, so name order is index order for the tie-break.)
    #[test]
    fn the_pick_is_best_across_scan_blocks((models, req) in models_and_request_of(60..100)) {
        let policy = Policy::from_toml_str(&policy_toml(&models, &req)).unwrap();
        let engine = engine(&models);
        let verdicts: Vec<(bool, f64)> = models.iter().enumerate().map(|(i, m)| oracle(i, m, &req)).collect();
        check_auto_pick(&policy, &engine, &req, &verdicts)?;
    }
}

fn split_policy(weights: &[u32], cost_in: &str) -> String {
    let versions: Vec<String> = (0..weights.len()).map(|i| format!("\"v{i}\"")).collect();
    let mut s = format!(
        "[routing]\nallow_anonymous = true\n[[models]]\nname = \"m\"\nversions = [{}]\ncost_per_1k_input = {cost_in}\ncost_per_1k_output = 0.0\nquality = 0.5\ncontext_limit = 100\n[[splits]]\nname = \"exp\"\nmodel = \"m\"\narms = [\n",
        versions.join(", ")
    );
    for (i, w) in weights.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {{ name = \"arm{i}\", target = \"m@v{i}\", weight = {w} }},"
        );
    }
    s.push_str("]\n");
    s
}

/// Integer weights summing to 100, from sorted cut points.
fn split_weights() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..=100, 1..4).prop_map(|mut cuts| {
        cuts.sort_unstable();
        let mut w = Vec::with_capacity(cuts.len() + 1);
        let mut last = 0;
        for c in cuts {
            w.push(c - last);
            last = c;
        }
        w.push(100 - last);
        w
    })
}

fn arm_of(policy: &Policy, user: &str) -> usize {
    let mut req = RouteRequest::new(ModelHint::parse("m"), Caller::Anonymous);
    req.user = Some(user.to_string());
    let r = route(policy, &req, &switchyard_policies::IdleEngine).unwrap();
    r.arm.as_deref().unwrap()[3..].parse().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn split_shares_converge_to_weights(weights in split_weights(), salt in "[a-z]{0,6}") {
        let policy = Policy::from_toml_str(&split_policy(&weights, "0.0")).unwrap();
        const USERS: usize = 20_000;
        let mut counts = vec![0usize; weights.len()];
        for u in 0..USERS {
            counts[arm_of(&policy, &format!("{salt}user-{u}"))] += 1;
        }
        for (w, c) in weights.iter().zip(&counts) {
            let share = *c as f64 / USERS as f64;
            // Six standard errors at worst (p = 0.5): a wrong mapping misses by far more.
            prop_assert!((share - f64::from(*w) / 100.0).abs() < 0.022, "weights {weights:?} counts {counts:?}");
            if *w == 0 {
                prop_assert_eq!(*c, 0);
            }
        }
    }

    #[test]
    fn sticky_assignment_survives_repeats_and_unrelated_reloads(
        weights in split_weights(),
        users in prop::collection::vec("[a-zA-Z0-9@._-]{1,24}", 1..50),
    ) {
        let store = PolicyStore::new(Policy::from_toml_str(&split_policy(&weights, "0.0")).unwrap());
        let first: Vec<usize> = users.iter().map(|u| arm_of(&store.current(), u)).collect();
        for _ in 0..3 {
            let again: Vec<usize> = users.iter().map(|u| arm_of(&store.current(), u)).collect();
            prop_assert_eq!(&again, &first);
        }
        // A reload that leaves the split alone (only a price changes) keeps every user.
        store.reload_from_str(&split_policy(&weights, "0.5"), "reloaded").unwrap();
        let after: Vec<usize> = users.iter().map(|u| arm_of(&store.current(), u)).collect();
        prop_assert_eq!(&after, &first);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn budgets_are_never_overspent_under_concurrency(
        limit in 1_000u32..50_000,
        threads in 2usize..8,
        sizes in prop::collection::vec((1u32..500, 1u32..800, 0u32..=100), 32),
    ) {
        let src = format!(
            "[[models]]\nname = \"m\"\nversion = \"v1\"\ncost_per_1k_input = 0.001\ncost_per_1k_output = 0.002\nquality = 0.5\ncontext_limit = 100000\n\
             [[tenants]]\nname = \"t\"\n[[tenants.budgets]]\nwindow = \"5200w\"\nlimit_tokens = {limit}\n\
             [[tenants.budgets]]\nwindow = \"5200w\"\nlimit_cost = {:?}\n",
            f64::from(limit) * 1.5e-6
        );
        let store = Arc::new(PolicyStore::new(Policy::from_toml_str(&src).unwrap()));
        let sizes = Arc::new(sizes);
        let workers: Vec<_> = (0..threads).map(|t| {
            let store = Arc::clone(&store);
            let sizes = Arc::clone(&sizes);
            std::thread::spawn(move || {
                let (mut ok, mut refused) = (0u32, 0u32);
                for round in 0..200usize {
                    let (prompt, out, used) = sizes[(round + t * 7) % sizes.len()];
                    let mut req = RouteRequest::new(ModelHint::parse("m"), Caller::Tenant("t".into()));
                    req.prompt_tokens = prompt;
                    req.max_output_tokens = Some(out);
                    match store.route(&req, &switchyard_policies::IdleEngine) {
                        Ok(r) => {
                            ok += 1;
                            let current = store.current();
                            for b in current.budgets("t").unwrap() {
                                let s = b.snapshot();
                                assert!(s.settled + s.reserved <= s.limit + 1e-9, "{s:?}");
                            }
                            // Actual usage never exceeds the reserved upper bound.
                            let completion = Completion {
                                usage: Usage { prompt_tokens: prompt, cached_tokens: 0, completion_tokens: out * used / 100 },
                                succeeded: true,
                                latency_ms: 1.0,
                            };
                            if round % 5 == 0 { drop(r) } else { r.finish(completion); }
                        }
                        Err(_) => refused += 1,
                    }
                }
                (ok, refused)
            })
        }).collect();
        let mut total_ok = 0;
        for w in workers {
            total_ok += w.join().unwrap().0;
        }
        prop_assert!(total_ok > 0);
        for b in store.current().budgets("t").unwrap() {
            let s = b.snapshot();
            prop_assert!(s.reserved.abs() < 1e-9, "reservations left: {:?}", s);
            prop_assert!(s.settled <= s.limit + 1e-9, "overspent: {:?}", s);
        }
    }
}
