//! The drill library in `chaos/`: every file is a ChaosDrill the apiserver
//! accepts as written (strict field validation and the CRD's CEL rules)
//! and the operator's own checks pass; its comment says what it proves, its
//! blast radius, its SLO and how it ends; every objective evaluates at the
//! stack's real Prometheus once the drill's namespace and sale are filled
//! in; the library covers every fault kind; the Friday-evening calendar
//! skips what it says it skips; and the gateway drills, run on the real
//! node under page views, end as their comments say.

mod common;

use std::{collections::BTreeSet, path::Path};

use common::{
    real_node::{
        Scene, await_scraped_and_up, cluster_ip, ended_run, ready_pods, residue, views_of,
    },
    setup,
};
use flashsale_api::{
    ChaosDrill,
    calendar::Calendar,
    chaosdrill::{RunOutcome, RunRecord},
    validate,
};
use flashsale_e2e::{kube::TestNamespace, prometheus};
use jiff::{
    Timestamp,
    civil::{Date, Weekday},
    tz::TimeZone,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

/// Every `chaos/*.yaml`, by file name, with its text.
fn library() -> anyhow::Result<Vec<(String, String)>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../chaos");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            files.push((name, std::fs::read_to_string(&path)?));
        }
    }
    files.sort();
    Ok(files)
}

/// The fault a drill's first experiment injects, as its action names it.
fn fault(drill: &ChaosDrill) -> anyhow::Result<String> {
    let experiment = serde_json::to_value(&drill.spec.experiments[0])?;
    for (kind, action) in [
        ("podChaos", "action"),
        ("networkChaos", "action"),
        ("stressChaos", ""),
        ("timeChaos", ""),
    ] {
        let block = &experiment[kind];
        if block.is_object() {
            return Ok(match block[action].as_str() {
                Some(action) => action.to_owned(),
                None => kind.to_owned(),
            });
        }
    }
    anyhow::bail!("no fault in {experiment}")
}

#[tokio::test]
async fn every_drill_in_the_library_applies_says_what_it_proves_and_its_objectives_evaluate()
-> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "chaos-library").await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    let files = library()?;
    assert!(files.len() >= 8, "{} drills in chaos/", files.len());

    let mut faults = BTreeSet::new();
    for (file, text) in &files {
        for heading in ["Proves:", "Blast radius:", "SLO:", "Ends:"] {
            assert!(
                text.contains(&format!("\n# {heading}")),
                "{file}: its comment does not say {heading}"
            );
        }
        let mut object: Value = serde_yaml_ng::from_str(text)?;
        object["metadata"]["namespace"] = ns.name.clone().into();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(
            format!("{name}.yaml"),
            *file,
            "a drill is named as its file"
        );
        let drill = drills
            .patch(
                &name,
                &PatchParams::apply("chaos-library-test").validation_strict(),
                &Patch::Apply(&object),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        let problems = validate::chaos_drill(&drill.spec);
        assert!(problems.is_empty(), "{file}: {problems:?}");
        faults.insert(fault(&drill)?);

        for objective in &drill.spec.slo_guard.objectives {
            let query = objective.query_in(&ns.name, &drill.spec.sale_ref.name);
            assert!(!query.contains('$'), "{file}: {query}");
            prometheus::evaluates(&query)
                .await
                .map_err(|e| anyhow::anyhow!("{file}, {}: {e}", objective.name))?;
        }
    }
    let every: BTreeSet<String> = [
        "pod-kill",
        "container-kill",
        "delay",
        "partition",
        "stressChaos",
        "timeChaos",
    ]
    .map(str::to_owned)
    .into();
    assert!(faults.is_superset(&every), "faults covered: {faults:?}");
    Ok(())
}

#[test]
fn the_friday_evening_drill_never_runs_on_a_friday_evening_nor_in_a_sale_week() -> anyhow::Result<()>
{
    let (_, text) = library()?
        .into_iter()
        .find(|(file, _)| file == "friday-evening-blackout.yaml")
        .ok_or_else(|| anyhow::anyhow!("no friday-evening-blackout.yaml"))?;
    let drill: ChaosDrill = serde_yaml_ng::from_str(&text)?;
    let calendar = Calendar::new(&drill.spec)?;
    let zone = TimeZone::get("Asia/Shanghai")?;

    // Every run for a year from a Thursday: weekday evenings, Monday to
    // Thursday only, none in a blackout.
    let mut after: Timestamp = "2026-10-01T00:00:00+08:00".parse()?;
    let end: Timestamp = "2027-10-01T00:00:00+08:00".parse()?;
    let freezes: [(Date, Date); 2] = [
        ("2026-11-04".parse()?, "2026-11-13".parse()?),
        ("2026-12-05".parse()?, "2026-12-14".parse()?),
    ];
    let mut runs = 0;
    let mut thursdays = 0;
    while let Some(run) = calendar.next_run(after) {
        if run > end {
            break;
        }
        let local = run.to_zoned(zone.clone());
        assert_ne!(local.weekday(), Weekday::Friday, "a run on {local}");
        assert_eq!((local.hour(), local.minute()), (18, 0), "{local}");
        let day = local.date();
        assert!(
            !freezes.iter().any(|(from, to)| day >= *from && day < *to),
            "a run in a sale week: {local}"
        );
        thursdays += usize::from(local.weekday() == Weekday::Thursday);
        runs += 1;
        after = run;
    }
    // Four evenings a week for a year, less the two blacked-out weeks.
    assert!(runs > 190, "{runs} runs in a year");
    assert!(thursdays > 45, "{thursdays} Thursday runs");
    // A Friday 18:00 tick exists, and is not allowed.
    let friday: Timestamp = "2026-10-02T18:00:00+08:00".parse()?;
    let before: Timestamp = "2026-10-02T17:00:00+08:00".parse()?;
    assert_eq!(calendar.next_tick(before), Some(friday));
    assert_ne!(
        calendar.allowance(friday),
        flashsale_api::calendar::Allowance::Allowed
    );
    Ok(())
}

/// The library's drill `file` for `sale`, made to run now: its calendar
/// lifted (a run-now request, no windows or blackouts, a sale that may be
/// anything but Live), its experiment cut to `duration` and its steady
/// state to 5 s, so the test need not wait for Tuesday. Its fault, blast
/// radius, objectives and thresholds stay as written.
fn run_now(file: &str, sale: &str, duration: &str) -> anyhow::Result<ChaosDrill> {
    let (_, text) = library()?
        .into_iter()
        .find(|(name, _)| name == file)
        .ok_or_else(|| anyhow::anyhow!("no {file}"))?;
    let mut drill: Value = serde_yaml_ng::from_str(&text)?;
    drill["metadata"]["annotations"] = json!({"flashsale.dev/run-now": "test"});
    let spec = &mut drill["spec"];
    spec["saleRef"]["name"] = sale.into();
    spec["windows"] = json!([]);
    spec["blackouts"] = json!([]);
    spec["experiments"][0]["duration"] = duration.into();
    spec["sloGuard"]["steadyState"] = "5s".into();
    Ok(serde_json::from_value(drill)?)
}

/// Runs the library's `file` on the scene's sale to its end.
async fn run(scene: &Scene, file: &str) -> anyhow::Result<(ChaosDrill, RunRecord)> {
    let drills: Api<ChaosDrill> = Api::namespaced(scene.client.clone(), &scene.ns.name);
    let drill = drills
        .create(
            &PostParams::default(),
            &run_now(file, &scene.sale.name, "20s")?,
        )
        .await?;
    let ended = ended_run(&drills, &drill.name_any()).await?;
    drills
        .delete(&drill.name_any(), &DeleteParams::default())
        .await?;
    Ok((drill, ended))
}

#[tokio::test]
async fn the_librarys_gateway_drills_run_on_the_real_node_and_end_as_their_comments_say()
-> anyhow::Result<()> {
    let scene = Scene::start("chaos-library-run").await?;
    let (client, ns, sale) = (&scene.client, &scene.ns.name, &scene.sale.name);
    // Shoppers view the item page through the gateways' Service, as buyers
    // would, so the error-rate objectives read real traffic.
    let service = cluster_ip(client, ns, &format!("{sale}-gateway")).await?;
    let _views = views_of(vec![format!("http://{service}/api/v1/items/CASE")])?;

    for file in [
        "gateway-pod-kill.yaml",
        "gateway-container-kill.yaml",
        "gateway-clock-skew.yaml",
    ] {
        let (drill, ended) = run(&scene, file).await?;
        assert_eq!(
            ended.outcome,
            Some(RunOutcome::Succeeded),
            "{file} ends Succeeded: {ended:?}"
        );
        assert_eq!(ended.targets.len(), 1, "{file}: one gateway: {ended:?}");
        // Every objective was read from Prometheus with the drill's
        // namespace and sale filled in: none was blind.
        for objective in &drill.spec.slo_guard.objectives {
            assert!(
                ended.slo_extremes.contains_key(&objective.name),
                "{file}: no value of {}: {ended:?}",
                objective.name
            );
        }
        eprintln!(
            "chaos library: {file} {:?} on {:?}, worst {:?}",
            ended.outcome, ended.targets, ended.slo_extremes
        );
        // The next drill starts from two gateways scraped and up.
        let gateways = ready_pods(client, ns, sale, "gateway").await?;
        await_scraped_and_up(ns, &gateways).await?;
    }
    let left = residue(client, ns).await?;
    assert!(left.is_empty(), "chaos left in the pods: {left:?}");
    Ok(())
}
