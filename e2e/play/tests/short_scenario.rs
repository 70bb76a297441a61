//! The short scenario, end to end on the local stack's real node: the
//! operator for a namespace of its own, then `flashsale-scenario --short`
//! with the buyers reaching the gateways through the apiserver, then every
//! check it reports and the report rendered in headless Chromium.

use std::{collections::BTreeMap, path::Path, time::Duration};

use flashsale_e2e::{
    browser,
    kube::{TestNamespace, client, install_crds},
    operator::{Launcher, Operator},
    stack,
};

use serde_json::Value;

/// The operator for `namespace`, from the binary of the stack's images.
fn operator(namespace: &str) -> anyhow::Result<Operator> {
    let bin = std::env::var("FLASHSALE_OPERATOR_BIN").map_err(|_| {
        anyhow::anyhow!("FLASHSALE_OPERATOR_BIN is not set: run through `e2e/local/stack test`")
    })?;
    let prometheus = stack::prometheus_url()?;
    let args = [
        "--prometheus-url",
        &prometheus,
        "--status-refresh",
        "2s",
        "--log-format",
        "json",
    ];
    Launcher::new(bin).start(namespace, "operator", &args, &[])
}

const CHECKS: [&str; 7] = [
    "stock is conserved: sold + available == stock",
    "units sold == units paid (inventory, buyers, database)",
    "every acknowledged order is exactly one row, and nothing else is",
    "tiers went 0 → 1 → 2 → 1 → 0 with the load",
    "the drill was aborted by its SLO guard",
    "the sale, the policy and the drill told it in Events",
    "no chaos object is left",
];

const PLOTS: [&str; 6] = ["load", "buyers", "slo", "funnel", "orders", "latency"];

#[tokio::test]
async fn the_short_scenario_passes_every_check_and_its_report_renders() -> anyhow::Result<()> {
    let client = client().await?;
    install_crds(&client, &flashsale_api::crds(), "flashsale-play-tests").await?;
    let ns = TestNamespace::create(&client, "play").await?;
    let operator = operator(&ns.name)?;
    eprintln!("operator log: {}", operator.log.display());
    let out = std::env::temp_dir().join(format!("{}-report", ns.name));

    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale-scenario"))
        // Through the apiserver, as a CI job reaches a kind cluster; the
        // README's run goes through the Service's cluster IP.
        .args(["--short", "--reach", "apiserver", "--namespace", &ns.name])
        .arg("--out")
        .arg(&out)
        .kill_on_drop(true)
        .status();
    let status = tokio::time::timeout(Duration::from_secs(900), status).await??;

    let result = std::fs::read(out.join("result.json")).map_err(|err| {
        anyhow::anyhow!("the scenario exited with {status} and wrote no result ({err})")
    })?;
    let result: Value = serde_json::from_slice(&result)?;
    assert_every_check_passed(&result)?;
    assert!(status.success(), "the scenario exited with {status}");
    assert_tiers_and_drill(&result);
    assert_funnel(&result);
    assert_junit_lists_every_check(&out)?;
    assert_report_renders(&out).await?;
    drop(operator);
    Ok(())
}

/// Every check of [`CHECKS`] is in the result, and held.
fn assert_every_check_passed(result: &Value) -> anyhow::Result<()> {
    let checks: BTreeMap<&str, (bool, &str)> = result["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["name"].as_str()?,
                (c["passed"].as_bool()?, c["detail"].as_str().unwrap_or("")),
            ))
        })
        .collect();
    for name in CHECKS {
        let (passed, detail) = checks
            .get(name)
            .copied()
            .ok_or_else(|| anyhow::anyhow!("check {name:?} missing: {checks:?}"))?;
        eprintln!("{} {name}: {detail}", if passed { "✓" } else { "✗" });
        assert!(passed, "{name}: {detail}");
    }
    Ok(())
}

/// `junit.xml` holds one passed test case per check of [`CHECKS`].
fn assert_junit_lists_every_check(out: &Path) -> anyhow::Result<()> {
    let xml = std::fs::read_to_string(out.join("junit.xml"))?;
    let doc = roxmltree::Document::parse(&xml)?;
    let cases: Vec<(&str, bool)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|n| {
            let failed = n.children().any(|c| c.has_tag_name("failure"));
            (n.attribute("name").unwrap_or(""), failed)
        })
        .collect();
    for name in CHECKS {
        assert!(cases.contains(&(name, false)), "{name} in {xml}");
    }
    Ok(())
}

/// The policy walked the tiers up and back with the load, and the drill
/// was aborted by its SLO guard, with both latencies recorded.
fn assert_tiers_and_drill(result: &Value) {
    let tiers: Vec<i64> = result["tiers"]["changes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["tier"].as_i64())
        .collect();
    assert_eq!(tiers, [0, 1, 2, 1, 0]);
    let drill = &result["drill"];
    assert_eq!(drill["outcome"], "Aborted", "{drill}");
    assert_eq!(drill["reason"], "SloBreached", "{drill}");
    assert!(drill["detectionLatency"].is_string(), "{drill}");
    assert!(drill["abortLatency"].is_string(), "{drill}");
}

/// Buyers got through every stage of the funnel, no stage holding more
/// buyers than the one it follows from, every acknowledged order was persisted,
/// and some reservations were left unpaid.
fn assert_funnel(result: &Value) {
    let funnel = &result["funnel"];
    let n = |stage: &str| funnel[stage].as_u64().unwrap_or(0);
    let buyers = ["arrived", "queued", "admitted", "ordered", "paying"];
    for stage in buyers.iter().chain(&["reserved", "acknowledged", "paid"]) {
        assert!(n(stage) > 0, "no buyer got to {stage}: {funnel}");
    }
    // A buyer may order without being queued, when the room lets it by.
    for (later, earlier) in [
        ("queued", "arrived"),
        ("admitted", "queued"),
        ("ordered", "arrived"),
        ("paying", "ordered"),
    ] {
        assert!(n(later) <= n(earlier), "{later} > {earlier}: {funnel}");
    }
    assert!(n("ordered") <= n("acknowledged"), "{funnel}");
    assert_eq!(n("persisted"), n("acknowledged"), "{funnel}");
    assert!(
        n("paid") < n("acknowledged"),
        "no reservation was abandoned: {funnel}"
    );
}

/// The report in `out` renders in a real browser, with every plot drawn
/// from data; its screenshot goes next to it.
async fn assert_report_renders(out: &Path) -> anyhow::Result<()> {
    let report = out.join("report.html");
    let chromium = browser::Chromium::find().await?;
    let url = browser::file_url(&report)?;
    let dom = chromium.dump_dom(&url).await?;
    for plot in PLOTS {
        let at = dom
            .find(&format!("data-plot=\"{plot}\""))
            .ok_or_else(|| anyhow::anyhow!("plot {plot} missing from the rendered report"))?;
        let rest = &dom[at..];
        let end = rest.find("</svg>").unwrap_or(rest.len());
        assert!(
            rest[..end].contains("data-series="),
            "plot {plot} has no data series"
        );
    }
    let png = out.join("report.png");
    chromium.screenshot(&url, &png, 1280, 3600).await?;
    eprintln!(
        "report: {} (screenshot {})",
        report.display(),
        png.display()
    );
    Ok(())
}
