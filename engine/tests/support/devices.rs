//! Every compiled backend, for the engine's tests written once against
//! [`Backend`] (as the kernels' `test_device!`, `kernels/tests/devices/`):
//! `on_each_device!(body)` makes a module `body` with one `#[test]` per
//! backend, each calling `body(backend)` with a new `Arc` of it. A new
//! backend adds its arm here, behind its feature, and runs every such test.
//! Include it with `#[path = "support/devices.rs"] #[macro_use] mod devices;`.
//!
//! [`Backend`]: switchyard_kernels::Backend

macro_rules! on_each_device {
    ($body:ident) => {
        mod $body {
            #[test]
            fn cpu() {
                let backend = switchyard_kernels::cpu::CpuBackend::new(2);
                super::$body(std::sync::Arc::new(backend));
            }
        }
    };
}
