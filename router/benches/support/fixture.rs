//! The workload both policy-layer benches share: a policy of 100 models and 1,000
//! tenants, the fake backend serving every checkpoint, and the chat request each
//! tenant sends.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Body;
use http::Request;
use serde_json::json;
use switchyard_policies::ledger::{
    EmbeddedLedger, Ledger, MemoryLedger, RedisLedger, RedisOptions,
};
use switchyard_policies::{
    estimate_tokens, sha256_hex, stable_hash, Caller, Completion, Hints, ModelHint, Policy,
    PolicyStore, RouteRequest, Usage, HEADER_MIN_QUALITY, HEADER_TAGS,
};
use switchyard_router::fake::FakeBackend;
use switchyard_router::policy::PolicyRouting;
use switchyard_seam::{InferenceBackend, ModelCard};

pub const MODELS: usize = 100;
pub const TENANTS: usize = 1000;
/// What the fake generates: one token per word.
const REPLY: &str = "Routers route requests";
const SYSTEM: &str = "You are a terse assistant.";
const PROMPT: &str = "Write one sentence about request routing in under twenty words.";
/// The hints every request carries, as headers.
const HINTS: [(&str, &str); 2] = [(HEADER_MIN_QUALITY, "0.5"), (HEADER_TAGS, "chat")];
/// The checkpoint pass-through requests name (the fake serves it).
pub const PASSTHROUGH_MODEL: &str = "model-042@v1";

/// A policy of `MODELS` models (two versions each, a split with a rollback rule on every
/// tenth) and `TENANTS` tenants (half allowed everything, half two thirds of the
/// models), each with a token and a cost budget far above what the bench spends.
pub fn policy_toml() -> String {
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

pub fn api_key(tenant: usize) -> String {
    format!("sk-tenant-{tenant:04}")
}

/// The fake serving every `model-NNN@v1` and `@v2`, answering at once.
pub fn backend() -> Arc<dyn InferenceBackend> {
    let cards = (0..MODELS)
        .flat_map(|i| ["v1", "v2"].map(|v| format!("model-{i:03}@{v}")))
        .map(|id| ModelCard {
            parent: None,
            id,
            created: 1_700_000_000,
            owned_by: "bench".to_owned(),
            context_length: 8192,
        })
        .collect();
    Arc::new(FakeBackend::builder().models(cards).reply(REPLY).build())
}

/// The spend ledger the bench counts budgets in: `POLICY_LAYER_LEDGER` = `memory`
/// (default), `embedded` (a file in a fresh temporary directory) or `redis://HOST:PORT`.
fn ledger() -> Arc<dyn Ledger> {
    let store = std::env::var("POLICY_LAYER_LEDGER").unwrap_or_default();
    if store.starts_with("redis://") {
        return Arc::new(RedisLedger::new(RedisOptions::new(store)).expect("a Redis URL"));
    }
    match store.as_str() {
        "" | "memory" => Arc::new(MemoryLedger::new()),
        "embedded" => {
            let dir = std::env::temp_dir().join(format!("policy-bench-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Arc::new(EmbeddedLedger::open(&dir).expect("a ledger file in the temporary directory"))
        }
        other => panic!("POLICY_LAYER_LEDGER={other}: use memory, embedded or redis://HOST:PORT"),
    }
}

/// The bench policy, routed against `backend`.
pub fn routing(backend: &Arc<dyn InferenceBackend>) -> Arc<PolicyRouting> {
    let policy = Policy::from_toml_str(&policy_toml()).expect("the bench policy is valid");
    let store = Arc::new(PolicyStore::new(policy.with_ledger(ledger())));
    Arc::new(PolicyRouting::over_backend(store, Arc::clone(backend)))
}

/// xorshift64: a reproducible "random" tenant per request without a dependency.
pub struct Tenants(pub u64);

impl Tenants {
    pub fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % TENANTS as u64) as usize
    }
}

/// The request both apps get: only `model` differs (`auto`, or a served checkpoint).
pub fn chat_request(model: &str, tenant: usize, n: usize) -> Request<Body> {
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

/// The route request the layer builds for the bench request of `tenant`.
pub fn route_request(tenant: usize, n: usize) -> RouteRequest {
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

/// Routes `request` and settles it with a three-token completion, as the layer and the
/// handler do between them for one request.
pub fn route_and_settle(routing: &PolicyRouting, request: &RouteRequest) {
    let route = routing
        .route(request)
        .expect("every bench tenant has a model");
    std::hint::black_box(route.finish(Completion {
        usage: Usage {
            prompt_tokens: request.prompt_tokens,
            cached_tokens: 0,
            completion_tokens: 3,
        },
        succeeded: true,
        latency_ms: 1.0,
    }));
}
