//! The harness in seconds: the whole suite (every layout, the proxy, the
//! restarts, the metrics scrape, the one-model comparison) against
//! `loadgen fake-server` processes, then the report. Checks that every plot
//! and table is produced and that the figures it carries are the run's.

use std::process::Command;

#[test]
fn a_short_suite_produces_the_report() {
    let out = tempfile::tempdir().expect("temp dir");
    let loadgen = env!("CARGO_BIN_EXE_loadgen");
    let status = Command::new(loadgen)
        .args(["suite", "--out"])
        .arg(out.path())
        .args(["--switchyard", loadgen])
        .args([
            "--switchyard-command",
            "fake-server --startup-ms 50 --token-ms 1",
        ])
        .args([
            "--checkpoint",
            "a=/none/a.gguf",
            "--checkpoint",
            "b=/none/b.gguf",
        ])
        .args(["--k", "1,2", "--rates", "5,20", "--seconds", "1"])
        .args(["--clients", "1,4", "--client-seconds", "0.5"])
        .args(["--base-port", "28900"])
        .status()
        .expect("loadgen runs");
    assert!(status.success(), "suite failed: {status}");

    for file in [
        "results.json",
        "report.md",
        "throughput_k2.svg",
        "ttft_p99_k2.svg",
        "latency_p99_k2.svg",
        "latency_cdf_k2.svg",
        "memory.svg",
        "single_throughput.svg",
        "single_latency_p99.svg",
    ] {
        let path = out.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.len() > 200, "{file} is nearly empty");
    }

    let results: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("results.json")).expect("results"),
    )
    .expect("results parse");
    let multi = results["multi"].as_array().expect("multi runs");
    // K = 1 and 2, three layouts, two rates.
    assert_eq!(multi.len(), 2 * 3 * 2);
    for run in multi {
        assert_eq!(run["summary"]["failed"], 0, "failed requests in {run}");
        assert!(run["summary"]["tokens_per_second"].as_f64().unwrap_or(0.0) > 0.0);
    }
    // The one engine's swaps come from its /metrics: two models at 20 req/s
    // switch at least once; the other layouts have no such series.
    let one_engine_k2 = multi
        .iter()
        .find(|r| r["k"] == 2 && r["system"] == "switchyard one engine" && r["rate"] == 20.0)
        .expect("one engine at K=2");
    assert!(one_engine_k2["swaps"].as_u64().unwrap_or(0) >= 1);
    // Restart on switch restarted, and the memory of every system is known.
    let memory = results["memory"].as_array().expect("memory");
    let restart = memory
        .iter()
        .find(|m| m["k"] == 2 && m["system"] == "switchyard restart on switch")
        .expect("restart row");
    assert!(restart["restarts"].as_u64().unwrap_or(0) >= 2);
    assert!(memory
        .iter()
        .all(|m| m["peak_rss_bytes"].as_u64().unwrap_or(0) > 0));
    assert_eq!(results["single"].as_array().map(Vec::len), Some(2));

    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report");
    for needle in [
        "## K = 2",
        "switchyard replicas",
        "restart ÷ one engine",
        "## Memory",
        "## One model",
    ] {
        assert!(report.contains(needle), "report lacks `{needle}`");
    }
}
