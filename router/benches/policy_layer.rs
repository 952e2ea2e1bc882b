//! Routing overhead of the policy LAYER on a real HTTP request (100 models, 1,000
//! tenants; the workload is in `support/fixture.rs`), measured three ways:
//!
//! 1. **Whole request, two apps.** The same `POST /v1/chat/completions` through the
//!    whole app with the policy (`app_with_policy`, `model: auto`) and without
//!    (`app`, naming a served checkpoint), over the fake backend answering at once;
//!    the layer's cost is the difference of the two distributions.
//! 2. **The layer's own work, per request.** The chat route alone with a timer around
//!    the policy layer and another between the layer and the handler: the layer's span
//!    minus the handler's (extraction, generation, settling, response) is the layer's
//!    own work — reading and parsing the body, authenticating, routing, writing the
//!    response headers — plus one middleware hop. The same route with the pass-through
//!    layer (no policy) gives that hop's floor. One difference per request, so machine
//!    noise does not pile up from two distributions. The handler's timer encloses its
//!    own clock reads (system calls), so the difference does not count them as the
//!    layer's work; the bench prints what they cost.
//! 3. **`PolicyRouting::route` plus settling alone**, no HTTP.
//!
//! One thread: a current-thread tokio runtime, requests sent one at a time with
//! `tower::ServiceExt::oneshot`, each timed from the call to the last body byte, the
//! apps interleaved so machine noise hits them alike.
//!
//! Run: `taskset -c 0 cargo bench -p switchyard-router --bench policy_layer`
//! (`POLICY_LAYER_REQUESTS=N` changes the 20,000 requests per case.) Instruction counts
//! of the same work, free of noise: `scripts/policy-callgrind.sh`.

#[path = "support/fixture.rs"]
mod fixture;

use std::cell::Cell;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::handler::Handler;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post_service;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use switchyard_policies::RouteRequest;
use switchyard_router::layers::json_body::JsonBodyLayer;
use switchyard_router::layers::request_id::set_request_id_layer;
use switchyard_router::openai::chat::chat_completions;
use switchyard_router::openai::chat::ValidatedChatRequest;
use switchyard_router::policy::{ParseLimits, PolicyLayer, PolicyRouting};
use switchyard_router::{app, app_with_policy, AppState, RouterConfig};
use tower::{Layer, ServiceExt};

use fixture::{chat_request, route_and_settle, Tenants, MODELS, PASSTHROUGH_MODEL, TENANTS};

const DEFAULT_REQUESTS: usize = 20_000;
const WARMUP: usize = 2_000;

/// A point in time on two clocks: the wall clock, and the CPU time this thread has run
/// (which does not advance while the thread is preempted, so it shows the work done on
/// one core free of the shared machine's scheduling noise).
#[derive(Clone, Copy)]
struct Stamp {
    wall: Instant,
    cpu: Duration,
    /// Context switches of this thread so far.
    switches: i64,
}

impl Stamp {
    /// Opens a span that should not count its own clock reads: the slow reads (two
    /// system calls) first, the wall clock last, so the wall span starts after them.
    fn now() -> Stamp {
        let switches = thread_context_switches();
        let cpu = thread_cpu_time();
        Stamp {
            switches,
            cpu,
            wall: Instant::now(),
        }
    }

    /// Closes a span opened by [`Stamp::now`]: the wall clock first, then the slow reads.
    fn elapsed(self) -> Spans {
        let wall = Instant::now();
        let cpu = thread_cpu_time();
        let switches = thread_context_switches();
        Spans {
            wall: wall.duration_since(self.wall),
            cpu: cpu.saturating_sub(self.cpu),
            switched: switches != self.switches,
        }
    }

    /// Opens a span nested inside another that will subtract it ([`time_handler`]):
    /// this span encloses its own clock reads (wall clock first), so the outer span
    /// minus this one does not count the inner timer's system calls as the outer's
    /// work.
    fn enclosing() -> Stamp {
        let wall = Instant::now();
        let cpu = thread_cpu_time();
        Stamp {
            wall,
            cpu,
            switches: thread_context_switches(),
        }
    }

    /// Closes a span opened by [`Stamp::enclosing`]: the slow reads first, the wall
    /// clock last.
    fn enclosed(self) -> Spans {
        let switches = thread_context_switches();
        let cpu = thread_cpu_time();
        Spans {
            wall: Instant::now().duration_since(self.wall),
            cpu: cpu.saturating_sub(self.cpu),
            switched: switches != self.switches,
        }
    }
}

/// A span measured on both clocks.
#[derive(Clone, Copy, Default)]
struct Spans {
    wall: Duration,
    cpu: Duration,
    /// Whether the scheduler switched the thread out during the span: then other
    /// processes ran on this core and left its caches cold, which no clock subtracts.
    switched: bool,
}

impl Spans {
    fn minus(self, other: Spans) -> Spans {
        Spans {
            wall: self.wall.saturating_sub(other.wall),
            cpu: self.cpu.saturating_sub(other.cpu),
            switched: self.switched,
        }
    }
}

/// Voluntary plus involuntary context switches of the calling thread.
fn thread_context_switches() -> i64 {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; the call only writes into it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "per-thread resource usage is readable on Linux");
    usage.ru_nvcsw + usage.ru_nivcsw
}

/// `CLOCK_THREAD_CPUTIME_ID`: CPU time consumed by the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "the thread CPU clock is readable on Linux");
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

thread_local! {
    /// Time the last request spent inside the handler (set by [`time_handler`]).
    static IN_HANDLER: Cell<Option<Spans>> = const { Cell::new(None) };
    /// Time the last request spent inside the layer under test, handler included (set
    /// by [`time_layer`]).
    static IN_LAYER: Cell<Option<Spans>> = const { Cell::new(None) };
}

/// Innermost middleware: times everything below the policy layer.
async fn time_handler(request: AxumRequest, next: Next) -> Response {
    let start = Stamp::enclosing();
    let response = next.run(request).await;
    IN_HANDLER.with(|t| t.set(Some(start.enclosed())));
    response
}

/// Outermost middleware of the chat route: times the layer under test and all below.
async fn time_layer(request: AxumRequest, next: Next) -> Response {
    let start = Stamp::now();
    let response = next.run(request).await;
    IN_LAYER.with(|t| t.set(Some(start.elapsed())));
    response
}

/// The chat route alone: timer, policy layer (or pass-through), timer, handler. Outside
/// the timers, the app's body read and request-id layer: in the app every request carries an id by
/// the time it reaches the policy layer (generating one is a `getrandom` call, which
/// belongs to that layer, not to routing).
fn chat_route(state: AppState, policy: Option<Arc<PolicyRouting>>) -> Router {
    let handler = middleware::from_fn(time_handler).layer(chat_completions.with_state(state));
    let limits = ParseLimits {
        max_fanout: RouterConfig::default().max_fanout,
    };
    let route =
        post_service(PolicyLayer::<ValidatedChatRequest>::new(policy, limits).layer(handler))
            .route_layer(middleware::from_fn(time_layer));
    // The body is read (once, under the one body limit) before the timers, as in the app.
    let config = RouterConfig::default();
    Router::new()
        .route("/v1/chat/completions", route)
        .route_layer(JsonBodyLayer::new(
            config.max_body_bytes,
            config.body_read_timeout,
        ))
        .layer(set_request_id_layer())
}

/// Sends one request through `app`, timed from the call to the last body byte.
async fn timed(app: &Router, request: Request<Body>, policy: bool) -> Spans {
    let app = app.clone();
    let start = Stamp::now();
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

/// The layer's span minus the handler's: what the layer did (plus one middleware hop).
async fn own_work(app: &Router, request: Request<Body>, policy: bool) -> Spans {
    IN_HANDLER.with(|t| t.set(None));
    IN_LAYER.with(|t| t.set(None));
    timed(app, request, policy).await;
    let inner = IN_HANDLER
        .with(Cell::take)
        .expect("the handler timer runs for every request");
    let layer = IN_LAYER
        .with(Cell::take)
        .expect("the layer timer runs for every request");
    layer.minus(inner)
}

/// Routes and settles one request, timed.
fn route_alone(routing: &PolicyRouting, request: &RouteRequest) -> Spans {
    let start = Stamp::now();
    route_and_settle(routing, request);
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
    if samples.is_empty() {
        // Every request was switched out (a ledger that waits for the disk does that).
        return Summary {
            p50: f64::NAN,
            p99: f64::NAN,
            mean: f64::NAN,
            max: f64::NAN,
        };
    }
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

/// Which durations of a case a table shows.
type Pick = dyn Fn(&[Spans]) -> Vec<Duration>;

/// The four HTTP cases, one sample each per round.
#[derive(Default)]
struct Samples {
    whole_policy: Vec<Spans>,
    whole_plain: Vec<Spans>,
    own_policy: Vec<Spans>,
    own_plain: Vec<Spans>,
}

struct Apps {
    with_policy: Router,
    passthrough: Router,
    route_policy: Router,
    route_plain: Router,
}

/// One round: the same tenant through every case, in an order that rotates with `n`
/// so that no case always follows another.
async fn round(apps: &Apps, tenant: usize, n: usize, samples: &mut Samples) {
    for k in 0..4 {
        match (n + k) % 4 {
            0 => samples
                .whole_policy
                .push(timed(&apps.with_policy, chat_request("auto", tenant, n), true).await),
            1 => samples.whole_plain.push(
                timed(
                    &apps.passthrough,
                    chat_request(PASSTHROUGH_MODEL, tenant, n),
                    false,
                )
                .await,
            ),
            2 => samples
                .own_policy
                .push(own_work(&apps.route_policy, chat_request("auto", tenant, n), true).await),
            _ => samples.own_plain.push(
                own_work(
                    &apps.route_plain,
                    chat_request(PASSTHROUGH_MODEL, tenant, n),
                    false,
                )
                .await,
            ),
        }
    }
}

async fn run(requests: usize) {
    let backend = fixture::backend();
    let routing = fixture::routing(&backend);
    let state = AppState::new(backend, RouterConfig::default());
    let apps = Apps {
        with_policy: app_with_policy(state.clone(), Some(Arc::clone(&routing))),
        passthrough: app(state.clone()),
        route_policy: chat_route(state.clone(), Some(Arc::clone(&routing))),
        route_plain: chat_route(state, None),
    };

    let mut tenants = Tenants(0x5eed_1234_abcd_0001);
    let mut warm = Samples::default();
    for n in 0..WARMUP {
        round(&apps, tenants.next(), n, &mut warm).await;
    }
    let mut samples = Samples {
        whole_policy: Vec::with_capacity(requests),
        whole_plain: Vec::with_capacity(requests),
        own_policy: Vec::with_capacity(requests),
        own_plain: Vec::with_capacity(requests),
    };
    for n in 0..requests {
        round(&apps, tenants.next(), n, &mut samples).await;
    }
    let alone_requests: Vec<RouteRequest> = (0..requests)
        .map(|n| fixture::route_request(tenants.next(), n))
        .collect();
    for request in alone_requests.iter().take(WARMUP) {
        route_alone(&routing, request);
    }
    let alone: Vec<Spans> = alone_requests
        .iter()
        .map(|request| route_alone(&routing, request))
        .collect();
    let clock: Vec<Spans> = (0..requests).map(|_| Stamp::now().elapsed()).collect();
    let nested_clock: Vec<Spans> = (0..requests)
        .map(|_| Stamp::enclosing().enclosed())
        .collect();

    println!(
        "\nPolicy layer overhead: {MODELS} models, {TENANTS} tenants, {requests} requests \
         per case after {WARMUP} warm-up, one thread\n"
    );
    let cases = [
        ("`app` (pass-through), whole request", &samples.whole_plain),
        ("`app_with_policy`, whole request", &samples.whole_policy),
        (
            "policy layer's own work (layer − handler)",
            &samples.own_policy,
        ),
        (
            "pass-through layer's own work (middleware floor)",
            &samples.own_plain,
        ),
        ("`PolicyRouting::route` + settle alone", &alone),
        ("an empty span (timer floor inside every span)", &clock),
        (
            "the handler timer's own reads (subtracted from the layer's span)",
            &nested_clock,
        ),
    ];
    // The wall clock leaves the timers' own system calls out of a span (see [`Stamp`]);
    // the thread CPU clock cannot (reading it is one of them), so its spans keep about
    // a microsecond of timer. Both, over requests the scheduler did not switch out, are
    // free of other processes' time.
    let tables: [(&str, &Pick); 4] = [
        ("wall clock", &|spans| {
            spans.iter().map(|s| s.wall).collect()
        }),
        (
            "wall clock, requests the scheduler did not switch out",
            &|spans| {
                spans
                    .iter()
                    .filter(|s| !s.switched)
                    .map(|s| s.wall)
                    .collect()
            },
        ),
        ("thread CPU time", &|spans| {
            spans.iter().map(|s| s.cpu).collect()
        }),
        (
            "thread CPU time, requests the scheduler did not switch out",
            &|spans| {
                spans
                    .iter()
                    .filter(|s| !s.switched)
                    .map(|s| s.cpu)
                    .collect()
            },
        ),
    ];
    for (clock_name, pick) in tables {
        println!("{clock_name}:\n");
        println!("| case | p50 | p99 | mean | max | samples |");
        println!("| --- | --- | --- | --- | --- | --- |");
        for (case, spans) in cases {
            let picked = pick(spans);
            let kept = picked.len();
            println!("{} {kept} |", row(case, &summarize(picked)));
        }
        let policy = summarize(pick(&samples.whole_policy));
        let plain = summarize(pick(&samples.whole_plain));
        println!(
            "| whole-request difference (policy − pass-through) | {:.1} µs | {:.1} µs | {:.1} µs | | |\n",
            policy.p50 - plain.p50,
            policy.p99 - plain.p99,
            policy.mean - plain.mean,
        );
    }
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
