//! The compile gate (scripts/cuda-ptxas-gate.py) on ptxas reports written
//! here: it passes a report within budget and names each kind of breach.

use std::path::Path;
use std::process::Command;

const REPORT: &str = "\
ptxas info    : Compiling entry function 'sy_mmvq_q4_k_n8' for 'sm_90'
ptxas info    : Function properties for sy_mmvq_q4_k_n8
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 45 registers, used 0 barriers
ptxas info    : Compiling entry function 'sy_attention_hd256' for 'sm_90'
ptxas info    : Function properties for sy_attention_hd256
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 70 registers, used 1 barriers, 9000 bytes smem
";

/// Runs the gate in a folder of its own (`case`: tests run in parallel).
fn gate(case: &str, budgets: &str, report: &str) -> (bool, String) {
    let dir = Path::new(env!("OUT_DIR")).join("gate-test").join(case);
    std::fs::create_dir_all(&dir).expect("OUT_DIR is writable");
    let (b, r) = (dir.join("budgets.txt"), dir.join("k.sm_90.ptxas.log"));
    std::fs::write(&b, budgets).expect("the case's folder was just made");
    std::fs::write(&r, report).expect("the case's folder was just made");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cuda-ptxas-gate.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&b)
        .arg(&r)
        .output()
        .expect("python3 runs the gate (scripts/setup.sh installs it)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_gate_names_spills_stack_registers_and_shared_memory() {
    let (ok, text) = gate("breaches", "sy_attention_* 64 8192\n* 64 0\n", REPORT);
    assert!(!ok, "{text}");
    assert!(text.contains("sy_attention_hd256 (sm_90): spills 4 B stored, 4 B loaded; 8 B stack frame; 70 registers > 64; 9000 B shared > 8192"), "{text}");
    assert!(!text.contains("sy_mmvq_q4_k_n8 ("), "{text}");
    assert!(
        text.contains("2 kernel builds checked, 1 over budget"),
        "{text}"
    );
}

#[test]
fn the_gate_passes_a_report_within_budget_and_fails_an_empty_one() {
    let within = REPORT.replace(
        "8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads",
        "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
    );
    let (ok, text) = gate("within", "* 128 16384\n", &within);
    assert!(ok, "{text}");
    let (ok, text) = gate("empty", "* 128 16384\n", "");
    assert!(!ok && text.contains("no kernel reports"), "{text}");
}
