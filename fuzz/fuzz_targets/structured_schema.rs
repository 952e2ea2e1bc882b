//! libFuzzer entry of `switchyard_fuzz_targets::structured_schema` (what it checks is
//! documented there; `fuzz-replay` runs the same check on the stable toolchain).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| switchyard_fuzz_targets::structured_schema(data));
