//! The suite's library part (`--library`): every drill of `chaos/` besides
//! the guard check the sale itself plays, run one after the other on a sale
//! of its own while a steady flow of buyers orders, each ending as its
//! comment says; then every order the gateways acknowledged meanwhile is
//! found once in the database, by id.

use std::{collections::BTreeSet, time::Duration};

use anyhow::Context as _;
use flashsale_api::{ChaosDrill, FlashSale, chaosdrill::RunRecord};
use flashsale_e2e::{
    library::{self, FILES},
    order_flow::OrderFlow,
    stores::Stores,
    wait::poll_until,
};

use super::{
    GATEWAY_PORT, Scene, TICK, await_scraped, checks, delete_and_wait, open_sale,
    plan::LIBRARY_SKU, plan::Plan,
};
use crate::{buyers::Progress, report::Check};

/// Orders a second while the drills run.
const ORDERS_PER_SECOND: u32 = 10;
/// How long each drill's fault lasts (the files' own last minutes).
const FAULT: &str = "20s";
/// The longest the order-writer may take to store the orders after the
/// flow stopped.
const DRAIN: Duration = Duration::from_secs(120);
/// The library file the sale's own drill is.
const PLAYED: &str = "gateway-guard-check.yaml";

/// Runs the library on the sale `name` and returns a check per drill and
/// one for the orders; fails only when the sale could not be set up.
pub async fn play(
    scene: &Scene<'_>,
    name: &str,
    progress: &Progress,
) -> anyhow::Result<Vec<Check>> {
    let Scene {
        client,
        stores,
        prometheus,
        reach,
        ns,
    } = *scene;
    let plan = Plan::library(name);
    for (file, _) in FILES {
        delete_and_wait::<ChaosDrill>(client, ns, &drill_name(file)).await?;
    }
    let (keys, _) = open_sale(scene, &plan, progress).await?;
    let gateways = reach
        .service(client, ns, &plan.gateway_service(), GATEWAY_PORT)
        .await
        .context("reaching the library sale's gateways")?;
    let gateway = format!("http://{}", gateways.address);
    let flow = OrderFlow::signed(&gateway, name, LIBRARY_SKU, ORDERS_PER_SECOND, keys.jwt)?;
    poll_until(
        "the first acknowledged order",
        Duration::from_secs(60),
        TICK,
        || async {
            let tally = flow.tally();
            if tally.acknowledged.is_empty() {
                Err(format!("{tally:?}"))
            } else {
                Ok(())
            }
        },
    )
    .await?;
    let addresses = library::addresses(client, &stores.in_cluster).await?;

    let mut found = Vec::new();
    for (file, _) in FILES.iter().filter(|(file, _)| *file != PLAYED) {
        let outcome = run_one(scene, &plan, file, &addresses).await;
        let check = verdict(file, outcome);
        progress.line(format!(
            "library: {} {}",
            if check.passed { "✓" } else { "✗" },
            check.detail
        ));
        found.push(check);
        // The next drill starts from both gateways scraped and up.
        if let Err(err) = await_scraped(prometheus, &plan, ns).await {
            progress.line(format!("library: the gateways did not come back: {err:#}"));
        }
    }
    let tally = flow.stop().await;
    found.push(stored_once(stores, &tally.acknowledged).await?);
    delete_and_wait::<FlashSale>(client, ns, &plan.sale).await?;
    Ok(found)
}

/// The drill of `file` is named as the file.
fn drill_name(file: &str) -> String {
    file.trim_end_matches(".yaml").to_owned()
}

/// Runs `file` on the library's sale: its objectives hold first, then it
/// runs to its end.
async fn run_one(
    scene: &Scene<'_>,
    plan: &Plan,
    file: &str,
    addresses: &std::collections::BTreeMap<String, String>,
) -> anyhow::Result<(ChaosDrill, RunRecord)> {
    let request = format!("suite-{}", jiff::Timestamp::now().as_second());
    let drill = library::run_now(file, &plan.sale, &request, FAULT, addresses)?;
    library::await_objectives_hold(&drill, scene.ns, &plan.sale, &scene.stores.here.prometheus)
        .await?;
    library::run(scene.client, scene.ns, drill).await
}

/// Whether `file`'s run ended as its comment says, every objective read.
fn verdict(file: &str, outcome: anyhow::Result<(ChaosDrill, RunRecord)>) -> Check {
    let name = format!("{} ends as its comment says", drill_name(file));
    let expected = library::endings(file)
        .iter()
        .map(|(outcome, reason)| format!("{outcome:?} ({reason})"))
        .collect::<Vec<_>>()
        .join(" or ");
    let (drill, run) = match outcome {
        Ok(ran) => ran,
        Err(err) => {
            return Check {
                name,
                passed: false,
                detail: format!("the run did not happen: {err:#}; expected {expected}"),
            };
        }
    };
    let ended = run.outcome.zip(run.reason.as_deref());
    let as_said = library::endings(file)
        .iter()
        .any(|(o, r)| ended == Some((*o, *r)));
    let blind: Vec<&str> = drill
        .spec
        .slo_guard
        .objectives
        .iter()
        .filter(|o| !run.slo_extremes.contains_key(&o.name))
        .map(|o| o.name.as_str())
        .collect();
    let worst = run
        .slo_extremes
        .iter()
        .map(|(name, value)| format!("{name} {value}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut detail = format!(
        "{} on {}; worst {}; expected {expected}",
        checks::run_text(&run),
        run.targets.join(", "),
        if worst.is_empty() { "-" } else { &worst },
    );
    if !blind.is_empty() {
        detail.push_str(&format!("; never read: {}", blind.join(", ")));
    }
    Check {
        name,
        passed: as_said && blind.is_empty(),
        detail,
    }
}

/// Every order in `acknowledged` is one row of the database once the
/// order-writer caught up.
async fn stored_once(stores: &Stores, acknowledged: &BTreeSet<String>) -> anyhow::Result<Check> {
    let db = sqlx::PgPool::connect(&stores.here.database)
        .await
        .context("connecting to the order database")?;
    let ids: Vec<String> = acknowledged.iter().cloned().collect();
    let want = i64::try_from(ids.len())?;
    let count = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT count(*), count(DISTINCT order_id) FROM orders WHERE order_id = ANY($1)",
        )
        .bind(&ids)
        .fetch_one(&db)
        .await
        .map_err(|e| e.to_string())
    };
    // Waits until all are there, or a row twice ends the wait at once.
    let waited = poll_until("every acknowledged order stored", DRAIN, TICK, || async {
        let (rows, distinct) = count().await?;
        if rows != distinct || distinct == want {
            Ok(())
        } else {
            Err(format!("{distinct} of {want} stored"))
        }
    })
    .await;
    let (rows, distinct) = count().await.map_err(anyhow::Error::msg)?;
    Ok(Check {
        name: "every order acknowledged during the library's drills is stored once".to_owned(),
        passed: waited.is_ok() && rows == want && distinct == want,
        detail: format!(
            "{want} acknowledged, {distinct} stored, {} stored twice",
            rows - distinct
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_api::chaosdrill::RunOutcome;

    fn ran(file: &str, outcome: RunOutcome, reason: &str, read: &[&str]) -> anyhow::Result<Check> {
        let drill: ChaosDrill = serde_yaml_ng::from_str(library::text(file)?)?;
        let run = RunRecord {
            id: "r".to_owned(),
            outcome: Some(outcome),
            reason: Some(reason.to_owned()),
            targets: vec!["shop/gateway-1".to_owned()],
            slo_extremes: read.iter().map(|n| ((*n).to_owned(), 0.0)).collect(),
            ..RunRecord::default()
        };
        Ok(verdict(file, Ok((drill, run))))
    }

    #[test]
    fn a_run_passes_only_with_an_ending_its_comment_gives_and_every_objective_read()
    -> anyhow::Result<()> {
        let zone = "zone-partition.yaml";
        let held = ran(zone, RunOutcome::Succeeded, "SloHeld", &["order-errors"])?;
        assert!(!held.passed, "a zone cut that held nothing: {held:?}");
        assert!(
            held.detail.contains("expected Aborted (SloBreached)"),
            "{held:?}"
        );
        let aborted = ran(zone, RunOutcome::Aborted, "SloBreached", &["order-errors"])?;
        assert!(aborted.passed, "{aborted:?}");
        assert_eq!(aborted.name, "zone-partition ends as its comment says");
        let blind = ran(zone, RunOutcome::Aborted, "SloBreached", &[])?;
        assert!(
            !blind.passed && blind.detail.contains("never read: order-errors"),
            "{blind:?}"
        );
        // The delay's comment allows either ending.
        let delay = "inventory-redis-delay.yaml";
        let names: Vec<String> = {
            let drill: ChaosDrill = serde_yaml_ng::from_str(library::text(delay)?)?;
            drill
                .spec
                .slo_guard
                .objectives
                .iter()
                .map(|o| o.name.clone())
                .collect()
        };
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        for (outcome, reason) in [
            (RunOutcome::Succeeded, "SloHeld"),
            (RunOutcome::Failed, "NotInjected"),
        ] {
            assert!(ran(delay, outcome, reason, &names)?.passed, "{outcome:?}");
        }
        let missing = verdict(delay, Err(anyhow::anyhow!("the objectives never held")));
        assert!(
            !missing.passed && missing.detail.contains("never held"),
            "{missing:?}"
        );
        Ok(())
    }
}
