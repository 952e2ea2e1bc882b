//! Routing overhead per request: authenticate (sha256 + lookup), score 100 models against
//! every constraint with live state, pick, reserve and settle the budget, with 1,000
//! tenants in the policy. Criterion reports means; the loop at the end prints p50/p99.
//!
//! Run: `cargo bench -p switchyard-policies --bench routing`

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, Criterion};
use switchyard_policies::{
    sha256_hex, Caller, CandidateState, Completion, EngineView, ModelHint, Policy, PolicyStore,
    RouteRequest, Usage,
};

const MODELS: usize = 100;
const TENANTS: usize = 1000;

fn policy_source() -> String {
    let mut s = String::from("[routing]\nassumed_output_tokens = 256\n");
    for i in 0..MODELS {
        let _ = write!(
            s,
            "[[models]]\nname = \"model-{i:03}\"\nversions = [\"v1\", \"v2\"]\naliases = [\"alias-{i:03}\"]\n\
             cost_per_1k_input = {:?}\ncost_per_1k_output = {:?}\nquality = {:?}\n\
             quality_by_tag = {{ code = {:?}, chat = {:?} }}\ncontext_limit = 8192\nlatency_target_ms = 5000.0\nmax_queue_depth = 32\n",
            0.0001 * (1 + i % 17) as f64,
            0.0003 * (1 + i % 13) as f64,
            0.3 + 0.006 * i as f64,
            0.2 + 0.007 * (i % 97) as f64,
            0.4 + 0.005 * (i % 89) as f64,
        );
    }
    for i in (0..MODELS).step_by(10) {
        let _ = write!(
            s,
            "[[splits]]\nname = \"split-{i:03}\"\nmodel = \"model-{i:03}\"\n\
             arms = [{{ name = \"old\", target = \"model-{i:03}@v1\", weight = 90 }}, {{ name = \"new\", target = \"model-{i:03}@v2\", weight = 10 }}]\n\
             [splits.rollback]\nbaseline = \"old\"\ncandidate = \"new\"\nwindow = \"10m\"\nmin_samples = 100\nmax_error_rate_increase = 0.1\n"
        );
    }
    for t in 0..TENANTS {
        let allowed = if t % 2 == 0 {
            "[\"*\"]".to_string()
        } else {
            let names: Vec<String> = (0..MODELS)
                .filter(|m| (m + t) % 3 != 0)
                .map(|m| format!("\"model-{m:03}\""))
                .collect();
            format!("[{}]", names.join(", "))
        };
        let _ = write!(
            s,
            "[[tenants]]\nname = \"tenant-{t:04}\"\napi_keys = [\"sha256:{}\"]\nallowed_models = {allowed}\n\
             default_hints = {{ min_quality = 0.4 }}\n\
             [[tenants.budgets]]\nwindow = \"1h\"\nlimit_tokens = 1000000000000\n\
             [[tenants.budgets]]\nwindow = \"1d\"\nlimit_cost = 1000000000.0\n",
            sha256_hex(&format!("sk-tenant-{t:04}"))
        );
    }
    s
}

/// Live state by model name, as a router's view over engine queues might keep it.
struct Live(HashMap<String, CandidateState>);

impl EngineView for Live {
    fn state(&self, model: &str, _version: &str) -> CandidateState {
        self.0.get(model).copied().unwrap_or_default()
    }
}

fn live() -> Live {
    Live(
        (0..MODELS)
            .map(|i| {
                let state = CandidateState {
                    resident: i % 4 != 0,
                    queue_depth: (i % 7) as u32,
                    est_queue_wait_ms: (i % 7) as f64 * 40.0,
                    est_swap_or_load_ms: 800.0,
                    est_ms_per_token: 4.0 + (i % 5) as f64,
                    healthy: i % 23 != 0,
                };
                (format!("model-{i:03}"), state)
            })
            .collect(),
    )
}

fn request(i: usize, model: &str) -> RouteRequest {
    let mut r = RouteRequest::new(
        ModelHint::parse(model),
        Caller::ApiKey(format!("sk-tenant-{:04}", i % TENANTS)),
    );
    r.user = Some(format!("user-{i}"));
    r.hints.tags = vec!["code".into()];
    r.hints.max_latency_ms = Some(4000.0);
    r.prompt_tokens = 500;
    r.max_output_tokens = Some(200);
    r.request_id = i as u64;
    r
}

/// Routes and settles one request; false when it was refused (that path is timed too).
fn one(store: &PolicyStore, engine: &Live, req: &RouteRequest) -> bool {
    match store.route(req, engine) {
        Ok(route) => {
            black_box(route.finish(Completion {
                usage: Usage {
                    prompt_tokens: 480,
                    cached_tokens: 0,
                    completion_tokens: 150,
                },
                succeeded: true,
                latency_ms: 300.0,
            }));
            true
        }
        Err(e) => {
            black_box(e);
            false
        }
    }
}

fn bench(c: &mut Criterion) {
    let store =
        PolicyStore::new(Policy::from_toml_str(&policy_source()).expect("bench policy is valid"));
    let engine = live();
    let auto: Vec<RouteRequest> = (0..TENANTS).map(|i| request(i, "auto")).collect();
    let named: Vec<RouteRequest> = (0..TENANTS)
        .map(|i| request(i, &format!("alias-{:03}", (i * 7) % MODELS)))
        .collect();
    let mut group = c.benchmark_group("route");
    let mut i = 0usize;
    group.bench_function("auto_100_models_1000_tenants", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(one(&store, &engine, &auto[i % auto.len()]));
        })
    });
    group.bench_function("named_100_models_1000_tenants", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            // Some named requests are refused (permissions, health); that path counts too.
            black_box(one(&store, &engine, &named[i % named.len()]));
        })
    });
    group.finish();
}

/// p50 and p99 of single-request timings, printed in microseconds.
fn percentiles(store: &PolicyStore, engine: &Live, requests: &[RouteRequest], label: &str) {
    const N: usize = 50_000;
    for r in requests.iter().take(2000) {
        one(store, engine, r); // warm caches and allocator
    }
    let mut micros: Vec<f64> = Vec::with_capacity(N);
    let mut refused = 0;
    for i in 0..N {
        let req = &requests[i % requests.len()];
        let start = Instant::now();
        let ok = one(store, engine, req);
        micros.push(start.elapsed().as_secs_f64() * 1e6);
        refused += usize::from(!ok);
    }
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((N as f64 * q) as usize).min(N - 1)];
    println!(
        "{label}: p50 {:.2} µs, p99 {:.2} µs, max {:.2} µs over {N} requests ({refused} refused)",
        at(0.50),
        at(0.99),
        at(1.0)
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
    let store =
        PolicyStore::new(Policy::from_toml_str(&policy_source()).expect("bench policy is valid"));
    let engine = live();
    let auto: Vec<RouteRequest> = (0..TENANTS).map(|i| request(i, "auto")).collect();
    percentiles(
        &store,
        &engine,
        &auto,
        "route auto (100 models, 1000 tenants, reserve + settle)",
    );
    let named: Vec<RouteRequest> = (0..TENANTS)
        .map(|i| request(i * 2, &format!("alias-{:03}", (i * 10) % MODELS)))
        .collect();
    percentiles(
        &store,
        &engine,
        &named,
        "route named via split (reserve + settle)",
    );
}
