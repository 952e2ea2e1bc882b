//! Every compiled backend, for tests written once against [`Backend`]
//! (as candle's `test_device!`): `test_device!(body)` makes a module
//! `body` with one `#[test]` per backend, each calling `body(&backend)`
//! (the CPU once per ISA this machine has). A new backend adds its arm
//! here, behind its feature, and runs every such test.
//!
//! [`Backend`]: switchyard_kernels::Backend

#[macro_export]
macro_rules! test_device {
    ($body:ident) => {
        mod $body {
            #[test]
            fn cpu() {
                for isa in switchyard_kernels::cpu::Isa::supported() {
                    println!("{}: cpu {isa}", stringify!($body));
                    super::$body(&switchyard_kernels::cpu::CpuBackend::with_isa(2, isa));
                }
            }
        }
    };
}
