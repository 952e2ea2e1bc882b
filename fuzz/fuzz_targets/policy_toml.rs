//! Arbitrary text as a routing policy file: it must load or be refused with
//! diagnostics, never panic; a policy that loads must route a request.

#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_policies::{route, Caller, IdleEngine, ModelHint, Policy, RouteRequest};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policy) = Policy::from_toml_str_with_env(text, "fuzz.toml", &|_| None) else {
        return;
    };
    for model in ["auto", "m", "m@1"] {
        let mut request = RouteRequest::new(ModelHint::parse(model), Caller::Anonymous);
        request.prompt_tokens = 10;
        request.generations = 3;
        let _ = route(&policy, &request, &IdleEngine);
    }
});
