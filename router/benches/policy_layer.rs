//! Routing overhead of the policy LAYER on a real HTTP request: the same
//! `POST /v1/chat/completions` sent through the whole app with a policy of 100 models and
//! 1,000 tenants (`app_with_policy`) and without one (`app`, pass-through), over the fake
//! backend answering at once with four tokens. The layer's cost per request is the
//! difference; `PolicyRouting::route` (plus settling) is also timed alone.
//!
//! One thread: a current-thread tokio runtime, requests sent one at a time with
//! `tower::ServiceExt::oneshot`, each timed from the call to the last body byte, the two
//! apps interleaved so machine noise hits both alike.
//!
//! Run: `cargo bench -p switchyard-router --bench policy_layer`
//! (`POLICY_LAYER_REQUESTS=N` changes the 20,000 requests per app.)

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use switchyard_policies::{
    estimate_tokens, sha256_hex, stable_hash, Caller, Completion, Hints, ModelHint, Policy,
    PolicyStore, RouteRequest, Usage, HEADER_MIN_QUALITY, HEADER_TAGS,
};
use switchyard_router::backend::{InferenceBackend, ModelCard};
use switchyard_router::fake::FakeBackend;
use switchyard_router::policy::PolicyRouting;
use switchyard_router::{app, app_with_policy, AppState, RouterConfig};
use tower::ServiceExt;

const MODELS: usize = 100;
const TENANTS: usize = 1000;
const DEFAULT_REQUESTS: usize = 20_000;
const WARMUP: usize = 2_000;
/// What the fake generates: one token per word.
const REPLY: &str = "Routers route requests";
const SYSTEM: &str = "You are a terse assistant.";
const PROMPT: &str = "Write one sentence about request routing in under twenty words.";
/// The hints every request carries, as headers.
const HINTS: [(&str, &str); 2] = [(HEADER_MIN_QUALITY, "0.5"), (HEADER_TAGS, "chat")];
/// The checkpoint pass-through requests name (the fake serves it).
const PASSTHROUGH_MODEL: &str = "model-042@v1";

/// A policy of `MODELS` models (two versions each, a split with a rollback rule on every
/// tenth) and `TENANTS` tenants (half allowed everything, half two thirds of the
/// models), each with a token and a cost budget far above what the bench spends.
fn policy_toml() -> String {
    let mut s = String::from("[routing]\nassumed_output_tokens = 256\n");
    for i in 0..MODELS {
        let _ = write!(
            s,
            "[[models]]\nname = \"model-{i:03}\"\nversions = [\"v1\", \"v2\"]\n\
             cost_per_1k_input = {:?}\ncost_per_1k_output = {:?}\nquality = {:?}\n\
             quality_by_tag = {{ chat = {:?} }}\ncontext_limit = 8192\n\
             latency_target_ms = 5000.0\nmax_queue_depth = 32\n",
            0.0001 * (1 + i % 17) as f64,
            0.0003 * (1 + i % 13) as f64,
            0.3 + 0.006 * i as f64,
            0.4 + 0.005 * (i % 89) as f64,
        );
    }
    for i in (0..MODELS).step_by(10) {
        let _ = write!(
            s,
            "[[splits]]\nname = \"split-{i:03}\"\nmodel = \"model-{i:03}\"\n\
             arms = [{{ name = \"old\", target = \"model-{i:03}@v1\", weight = 90 }}, \
             {{ name = \"new\", target = \"model-{i:03}@v2\", weight = 10 }}]\n\
             [splits.rollback]\nbaseline = \"old\"\ncandidate = \"new\"\nwindow = \"10m\"\n\
             min_samples = 100\nmax_error_rate_increase = 0.1\n"
        );
    }
    for t in 0..TENANTS {
        let allowed = if t % 2 == 0 {
            "[\"*\"]".to_owned()
        } else {
            let names: Vec<String> = (0..MODELS)
                .filter(|m| (m + t) % 3 != 0)
                .map(|m| format!("\"model-{m:03}\""))
                .collect();
            format!("[{}]", names.join(", "))
        };
        let _ = write!(
            s,
            "[[tenants]]\nname = \"tenant-{t:04}\"\napi_keys = [\"sha256:{}\"]\n\
             allowed_models = {allowed}\n\
             [[tenants.budgets]]\nwindow = \"1h\"\nlimit_tokens = 1000000000000\n\
             [[tenants.budgets]]\nwindow = \"1d\"\nlimit_cost = 1000000000.0\n",
            sha256_hex(&api_key(t))
        );
    }
    s
}

fn api_key(tenant: usize) -> String {
    format!("sk-tenant-{tenant:04}")
}

/// The fake serving every `model-NNN@v1` and `@v2`, answering at once.
fn backend() -> FakeBackend {
    let cards = (0..MODELS)
        .flat_map(|i| ["v1", "v2"].map(|v| format!("model-{i:03}@{v}")))
        .map(|id| ModelCard {
            id,
            created: 1_700_000_000,
            owned_by: "bench".to_owned(),
            context_length: 8192,
        })
        .collect();
    FakeBackend::builder().models(cards).reply(REPLY).build()
}

/// xorshift64: a reproducible "random" tenant per request without a dependency.
struct Tenants(u64);

impl Tenants {
    fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % TENANTS as u64) as usize
    }
}

/// The request both apps get: only `model` differs (`auto`, or a served checkpoint).
fn chat_request(model: &str, tenant: usize, n: usize) -> Request<Body> {
    let body = json!({
        "model": model,
        "max_tokens": 4,
        "user": format!("user-{n}"),
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": PROMPT},
        ],
    });
    let mut request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {}", api_key(tenant)));
    for (name, value) in HINTS {
        request = request.header(name, value);
    }
    request
        .body(Body::from(body.to_string()))
        .expect("the bench request is well-formed")
}

/// Sends one request through `app`, timed from the call to the last body byte.
async fn timed(app: &Router, request: Request<Body>, policy: bool) -> Duration {
    let app = app.clone();
    let start = Instant::now();
    let response = app
        .oneshot(request)
        .await
        .expect("the router is infallible");
    let status = response.status();
    let routed = response.headers().contains_key("x-switchyard-model");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the fake's body reads")
        .to_bytes();
    let elapsed = start.elapsed();
    // Timing an error path would measure the wrong thing: stop loudly instead.
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(routed, policy, "policy headers present only with a policy");
    black_box(body);
    elapsed
}

/// The route request the layer builds for the bench request of `tenant`.
fn route_request(tenant: usize, n: usize) -> RouteRequest {
    let mut request = RouteRequest::new(ModelHint::parse("auto"), Caller::ApiKey(api_key(tenant)));
    let mut hints = Hints::default();
    for (name, value) in HINTS {
        hints
            .apply_header(name, value)
            .expect("the bench hints are valid");
    }
    request.hints = hints;
    request.user = Some(format!("user-{n}"));
    request.max_output_tokens = Some(4);
    request.prompt_tokens = estimate_tokens(SYSTEM.chars().count() + PROMPT.chars().count());
    request.request_id = stable_hash("request", &format!("bench-{n}"));
    request
}

/// Routes and settles one request, as the layer and the handler do between them.
fn route_alone(routing: &PolicyRouting, request: &RouteRequest) -> Duration {
    let start = Instant::now();
    let route = routing
        .route(request)
        .expect("every bench tenant has a model");
    black_box(route.finish(Completion {
        usage: Usage {
            prompt_tokens: request.prompt_tokens,
            completion_tokens: 3,
        },
        succeeded: true,
        latency_ms: 1.0,
    }));
    start.elapsed()
}

/// p50, p99, mean and max of `samples`, in microseconds.
struct Summary {
    p50: f64,
    p99: f64,
    mean: f64,
    max: f64,
}

fn summarize(mut samples: Vec<Duration>) -> Summary {
    samples.sort_unstable();
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    let at = |q: f64| {
        let rank = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len());
        micros(samples[rank - 1])
    };
    let total: Duration = samples.iter().sum();
    Summary {
        p50: at(0.50),
        p99: at(0.99),
        mean: micros(total) / samples.len() as f64,
        max: at(1.0),
    }
}

fn row(case: &str, s: &Summary) -> String {
    format!(
        "| {case} | {:.1} µs | {:.1} µs | {:.1} µs | {:.0} µs |",
        s.p50, s.p99, s.mean, s.max
    )
}

async fn run(requests: usize) {
    let policy = Policy::from_toml_str(&policy_toml()).expect("the bench policy is valid");
    let store = Arc::new(PolicyStore::new(policy));
    let backend: Arc<dyn InferenceBackend> = Arc::new(backend());
    let routing = Arc::new(PolicyRouting::over_backend(
        Arc::clone(&store),
        Arc::clone(&backend),
    ));
    let state = AppState::new(backend, RouterConfig::default());
    let with_policy = app_with_policy(state.clone(), Some(Arc::clone(&routing)));
    let passthrough = app(state);

    let mut tenants = Tenants(0x5eed_1234_abcd_0001);
    for n in 0..WARMUP {
        let tenant = tenants.next();
        timed(&with_policy, chat_request("auto", tenant, n), true).await;
        timed(
            &passthrough,
            chat_request(PASSTHROUGH_MODEL, tenant, n),
            false,
        )
        .await;
    }
    let mut layered = Vec::with_capacity(requests);
    let mut plain = Vec::with_capacity(requests);
    for n in 0..requests {
        let tenant = tenants.next();
        // Alternate which app goes first so neither always follows the other.
        let policy_request = chat_request("auto", tenant, n);
        let plain_request = chat_request(PASSTHROUGH_MODEL, tenant, n);
        if n % 2 == 0 {
            layered.push(timed(&with_policy, policy_request, true).await);
            plain.push(timed(&passthrough, plain_request, false).await);
        } else {
            plain.push(timed(&passthrough, plain_request, false).await);
            layered.push(timed(&with_policy, policy_request, true).await);
        }
    }
    let alone_requests: Vec<RouteRequest> = (0..requests)
        .map(|n| route_request(tenants.next(), n))
        .collect();
    for request in alone_requests.iter().take(WARMUP) {
        route_alone(&routing, request);
    }
    let alone: Vec<Duration> = alone_requests
        .iter()
        .map(|request| route_alone(&routing, request))
        .collect();

    let layered = summarize(layered);
    let plain = summarize(plain);
    let alone = summarize(alone);
    println!(
        "\nPolicy layer overhead: {MODELS} models, {TENANTS} tenants, {requests} requests \
         per app after {WARMUP} warm-up, one thread\n"
    );
    println!("| case | p50 | p99 | mean | max |\n| --- | --- | --- | --- | --- |");
    println!("{}", row("`app` (pass-through), whole request", &plain));
    println!("{}", row("`app_with_policy`, whole request", &layered));
    println!(
        "| policy layer overhead (difference) | {:.1} µs | {:.1} µs | {:.1} µs | |",
        layered.p50 - plain.p50,
        layered.p99 - plain.p99,
        layered.mean - plain.mean,
    );
    println!("{}", row("`PolicyRouting::route` + settle alone", &alone));
}

fn main() {
    let requests = std::env::var("POLICY_LAYER_REQUESTS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_REQUESTS);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
    runtime.block_on(run(requests));
}
