//! A driver for counting the policy layer's instructions with callgrind (noise-free,
//! unlike wall-clock time on a shared machine). It sends the `policy_layer` bench's
//! request through one app, after a warm-up, inside [`measured`], so that callgrind
//! can count only that part:
//!
//! ```sh
//! scripts/policy-callgrind.sh        # both apps and routing alone, per-request counts
//! ```
//!
//! `POLICY_CALLS_APP` picks what is driven: `policy` (`app_with_policy`, `model: auto`),
//! `passthrough` (`app`, naming a served checkpoint) or `route`
//! (`PolicyRouting::route` plus settling, no HTTP). `POLICY_CALLS_REQUESTS` sets how
//! many requests are measured (default 1,000).

#[path = "support/fixture.rs"]
mod fixture;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use switchyard_policies::RouteRequest;
use switchyard_router::policy::PolicyRouting;
use switchyard_router::{app, app_with_policy, AppState, RouterConfig};
use tokio::runtime::Runtime;
use tower::ServiceExt;

use fixture::{chat_request, route_and_settle, route_request, Tenants, PASSTHROUGH_MODEL};

const WARMUP: usize = 500;

/// The system allocator, counting allocations (a relaxed add each: a few instructions
/// in every app alike), so the driver can print allocations per request.
struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc` or `realloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

enum Work {
    Http(Router, Vec<Request<Body>>),
    Route(Arc<PolicyRouting>, Vec<RouteRequest>),
}

/// The counted part: everything callgrind sees runs inside this call.
#[inline(never)]
fn measured(runtime: &Runtime, work: Work) -> usize {
    match work {
        Work::Http(app, requests) => runtime.block_on(send_all(&app, requests)),
        Work::Route(routing, requests) => {
            requests.iter().for_each(|r| route_and_settle(&routing, r));
            requests.len()
        }
    }
}

async fn send_all(app: &Router, requests: Vec<Request<Body>>) -> usize {
    let mut sent = 0;
    for request in requests {
        let response = app
            .clone()
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the fake's body reads")
            .to_bytes();
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        black_box(body);
        sent += 1;
    }
    sent
}

fn main() {
    let which = std::env::var("POLICY_CALLS_APP").unwrap_or_else(|_| "policy".to_owned());
    let requests = std::env::var("POLICY_CALLS_REQUESTS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
    let backend = fixture::backend();
    let routing = fixture::routing(&backend);
    let state = AppState::new(backend, RouterConfig::default());
    let mut tenants = Tenants(0x5eed_1234_abcd_0001);
    let mut work = |n: usize| -> Work {
        match which.as_str() {
            "policy" => Work::Http(
                app_with_policy(state.clone(), Some(Arc::clone(&routing))),
                (0..n)
                    .map(|i| chat_request("auto", tenants.next(), i))
                    .collect(),
            ),
            "passthrough" => Work::Http(
                app(state.clone()),
                (0..n)
                    .map(|i| chat_request(PASSTHROUGH_MODEL, tenants.next(), i))
                    .collect(),
            ),
            "route" => Work::Route(
                Arc::clone(&routing),
                (0..n).map(|i| route_request(tenants.next(), i)).collect(),
            ),
            other => panic!("POLICY_CALLS_APP={other}: use policy, passthrough or route"),
        }
    };
    // The warm-up runs outside `measured` (one-time costs: metric registration, lazy
    // statics, allocator growth); then the measured batch.
    let warm = work(WARMUP);
    match warm {
        Work::Http(app, requests) => {
            runtime.block_on(send_all(&app, requests));
        }
        Work::Route(routing, requests) => {
            requests.iter().for_each(|r| route_and_settle(&routing, r))
        }
    }
    let batch = work(requests);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let sent = measured(&runtime, batch);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    println!(
        "{which}: {sent} requests measured, {:.1} allocations (or reallocations) per request",
        allocations as f64 / sent.max(1) as f64
    );
}
