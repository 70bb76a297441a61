//! How long a degradation change takes to reach every gateway replica, from
//! the moment the operator sends its write to the `<sale>-degradation`
//! ConfigMap (so the API server's write is included: the watch event often
//! arrives before the write's own answer), against the real API server of the local stack. Two kinds of
//! watcher follow the same ConfigMap in the same run:
//!
//! - `gateway`: the gateway's own `watch_config_map` (one per replica), which
//!   parses the data and publishes it on the replica's switchboard;
//! - `raw-watch`: a bare `kube::runtime::watcher` on the same object, the
//!   floor any API-server watch can reach.
//!
//! For each change the time until the *last* replica holds it is what
//! counts (the contract: every gateway within 500 ms). Medians of several
//! runs and the per-run ratio are printed.
//!
//! Needs the stack (`eval "$(e2e/local/stack env)"`). Run:
//! `cargo run --release -p flashsale-bench --example bench_propagation -- --replicas 3 --changes 20 --runs 5`

use std::{collections::BTreeMap, time::Duration};

use clap::Parser;
use flashsale_bench::{Recorder, median};
use flashsale_e2e::kube::{TestNamespace, client};
use futures::StreamExt;
use gateway::degradation::{Switchboard, watch_config_map};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use tokio::{
    sync::{oneshot, watch},
    time::Instant,
};

/// Degradation propagation: the gateway's ConfigMap watch vs a raw watch.
#[derive(Debug, Parser)]
struct Options {
    /// Gateway replicas (and raw watchers) following the ConfigMap.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Changes per run.
    #[arg(long, default_value_t = 20)]
    changes: u64,
    /// Runs; medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Longest wait for one change to arrive everywhere.
    #[arg(long, default_value_t = 10)]
    deadline_seconds: u64,
}

const NAME: &str = "bench-degradation";

fn data(generation: u64) -> BTreeMap<String, String> {
    let tier = if generation.is_multiple_of(2) {
        "2"
    } else {
        "0"
    };
    BTreeMap::from([
        ("tier".to_owned(), tier.to_owned()),
        ("generation".to_owned(), generation.to_string()),
        ("reason".to_owned(), "benchmark".to_owned()),
        ("changedAt".to_owned(), jiff::Timestamp::now().to_string()),
    ])
}

/// A raw watcher: the newest generation it saw in the ConfigMap's data.
fn raw_watch(api: Api<ConfigMap>) -> watch::Receiver<u64> {
    let (seen, receiver) = watch::channel(0);
    let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    tokio::spawn(async move {
        let mut events = watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            let map = match event {
                Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map)) => map,
                _ => continue,
            };
            let generation = map
                .data
                .as_ref()
                .and_then(|d| d.get("generation"))
                .and_then(|g| g.parse().ok())
                .unwrap_or(0);
            if seen.send(generation).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Time from `since` until every receiver holds `generation` or more.
async fn all_reached(
    receivers: &mut [watch::Receiver<u64>],
    generation: u64,
    since: Instant,
    deadline: Duration,
) -> anyhow::Result<Duration> {
    for receiver in receivers.iter_mut() {
        tokio::time::timeout(deadline, receiver.wait_for(|g| *g >= generation))
            .await
            .map_err(|_| {
                anyhow::anyhow!("generation {generation} not seen within {deadline:?}")
            })??;
    }
    Ok(since.elapsed())
}

/// One run: per change, (gateway, raw) times until the last replica had it, in ms.
async fn run(
    opts: &Options,
    api: &Api<ConfigMap>,
    client: &kube::Client,
    ns: &str,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut stops = Vec::new();
    let mut gateways = Vec::new();
    for _ in 0..opts.replicas {
        let board = Switchboard::new();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(watch_config_map(
            client.clone(),
            ns.to_owned(),
            NAME.to_owned(),
            board.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        let (generation, receiver) = watch::channel(0);
        let mut updates = board.subscribe();
        tokio::spawn(async move {
            while updates.changed().await.is_ok() {
                let seen = updates.borrow_and_update().generation;
                if generation.send(seen).is_err() {
                    return;
                }
            }
        });
        stops.push(stop);
        gateways.push(receiver);
    }
    let mut raws: Vec<_> = (0..opts.replicas).map(|_| raw_watch(api.clone())).collect();
    let deadline = Duration::from_secs(opts.deadline_seconds);
    let base = api
        .get(NAME)
        .await?
        .data
        .and_then(|d| d.get("generation").and_then(|g| g.parse::<u64>().ok()))
        .unwrap_or(1);
    // Everyone is following before the clock starts.
    all_reached(&mut gateways, base, Instant::now(), deadline).await?;
    all_reached(&mut raws, base, Instant::now(), deadline).await?;
    let (mut gateway, mut raw) = (Vec::new(), Vec::new());
    for generation in base + 1..=base + opts.changes {
        let patch = serde_json::json!({"data": data(generation)});
        let sent = Instant::now();
        api.patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let (g, r) = tokio::join!(
            all_reached(&mut gateways, generation, sent, deadline),
            all_reached(&mut raws, generation, sent, deadline)
        );
        gateway.push(g?.as_secs_f64() * 1e3);
        raw.push(r?.as_secs_f64() * 1e3);
    }
    drop(stops);
    Ok((gateway, raw))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    let client = client().await?;
    let ns = TestNamespace::create(&client, "bench-propagation").await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            labels: Some(
                [(
                    flashsale_degradation::MANAGED_BY_KEY.to_owned(),
                    flashsale_degradation::MANAGED_BY.to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some(data(1)),
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &map).await?;
    println!(
        "{} runs of {} changes, {} replicas: ms from sending the write until the last replica holds the change",
        opts.runs, opts.changes, opts.replicas
    );
    let (mut medians, mut ratios) = (Vec::new(), Vec::new());
    let mut all_gateway = Vec::new();
    for run_index in 1..=opts.runs {
        let (gateway, raw) = run(&opts, &api, &client, &ns.name).await?;
        let (gateways, raws) = (
            Recorder::of_ms(gateway.iter().copied()),
            Recorder::of_ms(raw.iter().copied()),
        );
        let (g, r) = (gateways.quantile_ms(0.5), raws.quantile_ms(0.5));
        println!(
            "run {run_index}: gateway median {g:.1} p99 {:.1} | raw-watch median {r:.1} p99 {:.1} | ratio {:.2}",
            gateways.quantile_ms(0.99),
            raws.quantile_ms(0.99),
            g / r
        );
        medians.push(g);
        ratios.push(g / r);
        all_gateway.extend(gateway);
    }
    println!(
        "median of runs: gateway {:.1} ms, gateway/raw-watch {:.2}; worst change {:.1} ms (budget 500 ms)",
        median(medians).unwrap_or(f64::NAN),
        median(ratios).unwrap_or(f64::NAN),
        all_gateway.iter().copied().fold(0.0, f64::max)
    );
    Ok(())
}
