//! The scenario: a whole flash sale on a cluster (the local stack's real
//! node, or any cluster whose stores a Secret names), played and then
//! proven.
//!
//! 1. The sale is applied and warms up; its pods start on the real node.
//! 2. A DegradationPolicy reads the gateways' load from Prometheus.
//! 3. Buyers arrive, the load ramps up and down: the policy walks the tiers
//!    up and back. In the tail a ChaosDrill, inside a window the scenario
//!    opens, fails a real gateway; the real SLO breaks and its guard aborts.
//! 4. The sale ends; unpaid reservations return to stock; the order-writer
//!    drains.
//! 5. The checks, from the systems of record; the summary and the report.

mod checks;
mod facts;
mod library;
pub mod plan;
mod series;
mod summary;
mod tiers;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use flashsale_api::{
    ChaosDrill, DegradationPolicy, FlashSale, chaosdrill::RunRecord, flashsale::SalePhase,
};
pub use flashsale_e2e::reach::Reach;
use flashsale_e2e::{
    kafka,
    real_node::REAL_NODE_KEY,
    stores::{Stores, Urls},
    wait::poll_until,
};
use jiff::Timestamp;
use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Node, Secret},
};
use kube::{
    Client, Resource,
    api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use rand::RngCore;
use serde::Serialize;
use serde_json::json;
use tokio::{
    sync::{Mutex, watch},
    task::JoinHandle,
};

use crate::{
    buyers::{self, Progress},
    report::{BarPlot, Check, Report, TimePlot},
};
pub use checks::{Acked, Row, Stock};
use plan::{Plan, SLO, Wiring};
use series::{Source, Window};
pub use summary::Funnel;
use tiers::TierLog;

/// What to play, and where.
#[derive(Debug, Clone)]
pub struct Options {
    /// The namespace the operator watches.
    pub namespace: String,
    /// The numbers of the run.
    pub plan: Plan,
    /// Where the report, the result and the buyers' ledger go.
    pub out_dir: PathBuf,
    /// Seeds the buyers' choices.
    pub seed: u64,
    /// How the scenario reaches the sale's gateways and the cluster's
    /// stores and Prometheus.
    pub reach: Reach,
    /// Whether the library's other drills run too, on a sale of their own.
    pub library: bool,
}

/// How a played sale ended.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The checks, in order.
    pub checks: Vec<Check>,
    /// The funnel from arrivals to persisted orders.
    pub funnel: Funnel,
    /// The tiers the policy walked.
    pub tiers: TierLog,
    /// The drill's run, as the operator recorded it.
    pub drill: Option<RunRecord>,
    /// The HTML report.
    pub report: PathBuf,
    /// Seconds from the first step to the last.
    pub seconds: f64,
}

impl Outcome {
    /// Whether every check held.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }
}

/// The name of the result file in the output folder (JSON of [`Outcome`]).
pub const RESULT_FILE: &str = "result.json";
/// The name of the report in the output folder.
pub const REPORT_FILE: &str = "report.html";
/// The name of the checks as JUnit XML in the output folder.
pub const JUNIT_FILE: &str = "junit.xml";

const TICK: Duration = Duration::from_millis(250);
/// How long the buyers stay once the SLO holds again, so the report shows
/// the sale after the drill, not just its end.
const AFTERMATH: Duration = Duration::from_secs(15);

/// Numbered progress lines, one per step.
struct Steps {
    progress: Progress,
    total: usize,
    n: usize,
    started: Instant,
}

impl Steps {
    fn begin(&mut self, what: &str) {
        self.n += 1;
        self.progress.line(format!(
            "[{}/{}] {what} (+{}s)",
            self.n,
            self.total,
            self.started.elapsed().as_secs()
        ));
    }
}

/// Plays the sale and proves what happened; fails only when the scenario
/// could not run (a failed check is in the outcome, not an error).
pub async fn play(options: Options, progress: Progress) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let Options {
        namespace: ns,
        plan,
        out_dir,
        seed,
        reach,
        library,
    } = options;
    let mut steps = Steps {
        progress: progress.clone(),
        total: 6 + usize::from(library),
        n: 0,
        started,
    };
    let (client, stores, prometheus) = connect(reach).await?;
    let scene = Scene {
        client: &client,
        stores: &stores,
        prometheus: &prometheus,
        reach,
        ns: &ns,
    };

    steps.begin(&format!(
        "applying sale {ns}/{} with new keys and topics (the previous run's objects go first): \
         it warms up now and opens in {}s; its pods start",
        plan.sale,
        plan.opens_in.as_secs()
    ));
    let (keys, sale_id) = open_sale(&scene, &plan, &progress).await?;

    steps.begin("applying the DegradationPolicy: two tiers on the share of the planned peak load");
    apply_policy(&client, &ns, &plan).await?;

    steps.begin(&format!(
        "{} buyers at the peak for {}s; in the tail a drill fails a gateway under the SLO guard",
        plan.users,
        plan.load.as_secs()
    ));
    let played = play_load(&scene, &plan, &keys, seed, &progress).await?;

    steps.begin("ending the sale: unpaid reservations return to stock, the order-writer drains");
    let ended_at = Timestamp::now();
    end_sale(&Api::namespaced(client.clone(), &ns), &plan, &progress).await?;

    let library_checks = if library {
        steps.begin("running the drill library on a sale of its own under orders");
        library::play(&scene, &format!("{}-library", plan.sale), &progress).await?
    } else {
        Vec::new()
    };

    steps.begin("checking stock, orders, tiers and the drill against the systems of record");
    let mut proven = prove(&client, &stores, &ns, &plan, &sale_id, &played, &progress).await?;
    proven.checks.extend(library_checks);

    steps.begin("writing the report from the run's Prometheus data");
    let (funnel, plots, bars) = figures(&prometheus, &plan, &ns, &played, &proven).await?;
    let outcome = Outcome {
        checks: proven.checks,
        funnel,
        tiers: played.tiers,
        drill: proven.run,
        report: out_dir.join(REPORT_FILE),
        seconds: started.elapsed().as_secs_f64(),
    };
    let report = Report {
        title: format!("Flash sale {ns}/{}", plan.sale),
        subtitle: subtitle(&plan, &sale_id, played.from, ended_at),
        summary: summary::figures(&outcome, &plan),
        checks: outcome.checks.clone(),
        time_plots: plots,
        bar_plots: bars,
    };
    write_outputs(&out_dir, &report, &outcome, &played.outcome.ledger)?;
    progress.line(summary::text(&outcome));
    Ok(outcome)
}

/// Where the scenario plays: the apiserver, the cluster's stores and its
/// Prometheus, how the gateways are reached, and the namespace.
struct Scene<'a> {
    client: &'a Client,
    stores: &'a Stores,
    prometheus: &'a prometheus_http_query::Client,
    reach: Reach,
    ns: &'a str,
}

/// Opens `plan`'s sale: the previous run's objects of its name go, new
/// keys, Secrets and topics, then the sale, waited for until it is Live with
/// both gateways scraped. Its keys and sale id.
async fn open_sale(
    scene: &Scene<'_>,
    plan: &Plan,
    progress: &Progress,
) -> anyhow::Result<(Keys, String)> {
    let Scene {
        client, stores, ns, ..
    } = *scene;
    let keys = prepare(client, ns, plan, &stores.in_cluster.database).await?;
    let wiring = wire(client, stores).await?;
    let sales: Api<FlashSale> = Api::namespaced(client.clone(), ns);
    let sale_id = create_sale(&sales, plan, &wiring).await?;
    await_live(&sales, plan, progress).await?;
    await_scraped(scene.prometheus, plan, ns).await?;
    Ok((keys, sale_id))
}

/// The apiserver, the cluster's stores and its Prometheus, reached `reach`.
async fn connect(reach: Reach) -> anyhow::Result<(Client, Stores, prometheus_http_query::Client)> {
    // Any kubeconfig: `KUBECONFIG`, `~/.kube/config` or the pod's own.
    let client = Client::try_default()
        .await
        .context("connecting to the apiserver")?;
    let stores = Stores::discover(&client, reach)
        .await
        .context("finding the cluster's stores")?;
    let prometheus = stores.here.prometheus.parse().context("Prometheus URL")?;
    Ok((client, stores, prometheus))
}

/// What the checks found, with the facts the report draws from too.
struct Proven {
    /// The checks, in order.
    checks: Vec<Check>,
    /// The orders the gateway acknowledged.
    acked: Vec<Acked>,
    /// The order rows in PostgreSQL.
    rows: Vec<Row>,
    /// The drill's run, as the operator recorded it.
    run: Option<RunRecord>,
}

/// Checks the played sale against the systems of record: stock, orders,
/// tiers, the drill, and that no chaos is left.
async fn prove(
    client: &Client,
    stores: &Stores,
    ns: &str,
    plan: &Plan,
    sale_id: &str,
    played: &Played,
    progress: &Progress,
) -> anyhow::Result<Proven> {
    let acked = acked_orders(&played.outcome.ledger);
    let unresolved = unresolved_requests(&played.outcome.ledger, sale_id);
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
    let run = drills
        .get_opt(&plan.sale)
        .await?
        .and_then(|d| d.status.unwrap_or_default().history.into_iter().next());
    let (stock, rows) =
        settled_facts(&stores.here, sale_id, plan, &acked, &unresolved, progress).await?;
    let left = facts::chaos_left(client, ns).await?;
    let told = facts::events(client, ns, &uids(client, ns, &plan.sale).await?).await?;
    let checks = vec![
        checks::stock_conserved(&stock),
        checks::sold_is_paid(&stock, &acked, &rows),
        checks::orders_persisted_once(&acked, &unresolved, &rows),
        checks::tiers_walked(&played.tiers),
        checks::drill_aborted(run.as_ref(), SLO),
        checks::events_told(&told),
        checks::no_chaos_left(&left),
    ];
    Ok(Proven {
        checks,
        acked,
        rows,
        run,
    })
}

/// The uids of this run's sale, policy and drill (all named `name`), whose
/// Events the checks read: earlier objects of the same name had others.
async fn uids(client: &Client, ns: &str, name: &str) -> anyhow::Result<Vec<String>> {
    let sale = Api::<FlashSale>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?;
    let policy = Api::<DegradationPolicy>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?;
    let drill = Api::<ChaosDrill>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?;
    Ok([
        sale.and_then(|o| o.metadata.uid),
        policy.and_then(|o| o.metadata.uid),
        drill.and_then(|o| o.metadata.uid),
    ]
    .into_iter()
    .flatten()
    .collect())
}

/// The report's figures from the run's Prometheus data and the facts: the
/// funnel, the plots over time and the bar plots.
async fn figures(
    prometheus: &prometheus_http_query::Client,
    plan: &Plan,
    ns: &str,
    played: &Played,
    proven: &Proven,
) -> anyhow::Result<(Funnel, Vec<TimePlot>, Vec<BarPlot>)> {
    let source = Source {
        prometheus,
        plan,
        namespace: ns,
        window: Window {
            from: played.from,
            to: played.to,
        },
    };
    let funnel = funnel(&source, &played.outcome.tally, &proven.acked, &proven.rows).await?;
    let run = proven.run.as_ref();
    let plots = vec![
        source.load(&played.tiers, run).await?,
        source.buyers(played.active.clone()).await?,
        source.slo(run).await?,
    ];
    let bars: Vec<BarPlot> = vec![funnel.plot(), funnel.orders_plot(), source.latency().await?];
    Ok((funnel, plots, bars))
}

/// The report's line under the title: when and how the run was played.
fn subtitle(plan: &Plan, sale_id: &str, from: Timestamp, ended_at: Timestamp) -> String {
    format!(
        "played {} to {} UTC: {} buyers at the peak, {}s of load, sale {sale_id}",
        checks::time_of_day(from),
        checks::time_of_day(ended_at),
        plan.users,
        plan.load.as_secs()
    )
}

/// Creates this run's order topic and its dead-letter topic, and returns
/// how the sale reaches Redis and Kafka from inside the cluster, and the
/// nodes it must run on.
async fn wire(client: &Client, stores: &Stores) -> anyhow::Result<Wiring> {
    let topic = format!("play-orders-{}", Timestamp::now().as_second());
    let brokers = &stores.here.kafka_brokers;
    kafka::create_topic(brokers, &topic, 3)
        .await
        .context("creating the order topic")?;
    kafka::create_topic(brokers, &format!("{topic}.dlq"), 1)
        .await
        .context("creating the dead-letter topic")?;
    let kept_apart = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(REAL_NODE_KEY).limit(1))
        .await
        .context("listing the nodes")?;
    Ok(Wiring {
        redis_url: stores.in_cluster.redis.clone(),
        kafka_brokers: stores.in_cluster.kafka_brokers.clone(),
        topic,
        node_label: (!kept_apart.items.is_empty()).then(|| REAL_NODE_KEY.to_owned()),
    })
}

/// Creates the sale, opening `plan.opens_in` from now, and returns its
/// sale id.
async fn create_sale(
    sales: &Api<FlashSale>,
    plan: &Plan,
    wiring: &Wiring,
) -> anyhow::Result<String> {
    let opens = Timestamp::now() + plan.opens_in;
    let sale: FlashSale = serde_json::from_value(plan.sale(opens, wiring))?;
    let sale = sales
        .create(&PostParams::default(), &sale)
        .await
        .context("creating the sale")?;
    Ok(flashsale_api::children::Owner::new(&sale)?.sale_id())
}

/// Creates the DegradationPolicy and waits until it has read the load and
/// chosen a tier.
async fn apply_policy(client: &Client, ns: &str, plan: &Plan) -> anyhow::Result<()> {
    let policies: Api<DegradationPolicy> = Api::namespaced(client.clone(), ns);
    let policy: DegradationPolicy = serde_json::from_value(plan.policy(ns))?;
    policies
        .create(&PostParams::default(), &policy)
        .await
        .context("creating the policy")?;
    poll_until(
        "the policy reads the load",
        Duration::from_secs(60),
        TICK,
        || async {
            let p = policies.get(&plan.sale).await.map_err(|e| e.to_string())?;
            let status = p.status.unwrap_or_default();
            status
                .tier
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", status.observed.conditions))
        },
    )
    .await?;
    Ok(())
}

/// The orders the gateway acknowledged, as the checks compare them.
fn acked_orders(ledger: &buyers::Ledger) -> Vec<Acked> {
    ledger
        .orders()
        .map(|(_, order)| Acked {
            order_id: order.order_id.clone(),
            sku: order.sku.clone(),
            quantity: i64::try_from(order.quantity).unwrap_or(i64::MAX),
            paid: order.paid,
        })
        .collect()
}

/// The request ids of the purchases whose answer never came: each may or
/// may not have become an order.
fn unresolved_requests(ledger: &buyers::Ledger, sale_id: &str) -> Vec<String> {
    ledger
        .unresolved()
        .map(|(user, purchase)| {
            gateway::orders::request_id(sale_id, user, &purchase.idempotency_key)
        })
        .collect()
}

/// The stock and the order rows, read from Redis and PostgreSQL once they
/// prove the checks or, failing that, at the deadline. The last `expired`
/// events may still be on their way to the database when the sale has
/// drained, hence the polling.
async fn settled_facts(
    stores: &Urls,
    sale_id: &str,
    plan: &Plan,
    acked: &[Acked],
    unresolved: &[String],
    progress: &Progress,
) -> anyhow::Result<(Vec<Stock>, Vec<Row>)> {
    let records = facts::Records::connect(&stores.redis, &stores.database).await?;
    let facts = Mutex::new(None);
    let settled = poll_until(
        "the orders settle",
        Duration::from_secs(60),
        Duration::from_secs(1),
        || {
            let (facts, records) = (&facts, &records);
            async move {
                let stock = records
                    .stock(sale_id, &plan.items)
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                let rows = records.rows(sale_id).await.map_err(|e| format!("{e:#}"))?;
                let ok = checks::stock_conserved(&stock).passed
                    && checks::orders_persisted_once(acked, unresolved, &rows).passed;
                *facts.lock().await = Some((stock, rows));
                if ok {
                    Ok(())
                } else {
                    Err("not settled".to_owned())
                }
            }
        },
    )
    .await;
    if let Err(timeout) = settled {
        progress.line(format!("the orders did not settle: {timeout}"));
    }
    let Some(facts) = facts.lock().await.take() else {
        bail!("no facts could be read from Redis and PostgreSQL");
    };
    Ok(facts)
}

/// The funnel from arrivals to persisted orders: the buyers' tally, the
/// reservations Prometheus counted, the acknowledged orders and the rows.
async fn funnel(
    source: &Source<'_>,
    tally: &buyers::Tally,
    acked: &[Acked],
    rows: &[Row],
) -> anyhow::Result<Funnel> {
    Ok(Funnel {
        arrived: tally.arrived,
        queued: tally.queued,
        admitted: tally.admitted,
        ordered: tally.ordering_buyers,
        paying: tally.paying_buyers,
        rate_limited: tally.rate_limited,
        reserved: source.reserved().await?,
        acknowledged: acked.len() as u64,
        persisted: rows.len() as u64,
        paid: acked.iter().filter(|o| o.paid).count() as u64,
    })
}

/// The buyers' part: the load with the tiers watched, and the drill in the
/// tail.
struct Played {
    outcome: buyers::Outcome,
    tiers: TierLog,
    active: Vec<(i64, f64)>,
    from: Timestamp,
    to: Timestamp,
}

async fn play_load(
    scene: &Scene<'_>,
    plan: &Plan,
    keys: &Keys,
    seed: u64,
    progress: &Progress,
) -> anyhow::Result<Played> {
    let Scene {
        client,
        prometheus,
        reach,
        ns,
        ..
    } = *scene;
    // Kept until the buyers are done: dropping it closes a forward.
    let gateways = reach
        .service(client, ns, &plan.gateway_service(), GATEWAY_PORT)
        .await
        .context("reaching the gateways")?;
    let gateway = &format!("http://{}", gateways.address);
    let profile = buyers::Profile::sale(plan.load);
    let config = buyers_config(plan, gateway, keys, seed, profile.clone());
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let stop = async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    };
    let from = Timestamp::now();
    let load_started = Instant::now();
    let live = buyers::Counters::default();
    let load = tokio::spawn(buyers::run(config, progress.clone(), live.clone(), stop));
    let sampler = sample_active(live, stop_tx.subscribe());
    let tail = profile.start_of("tail").unwrap_or_else(|| profile.total());
    let (tiers, run) = follow_load(client, ns, plan, progress, load_started, tail).await?;
    if run.is_some() {
        // The buyers stay while the Deployment replaces the killed gateway,
        // so the report shows the SLO hold again.
        let restored = Instant::now();
        match await_scraped(prometheus, plan, ns).await {
            Ok(()) => {
                progress.line(format!(
                    "both gateways up again {}s after the drill ended",
                    restored.elapsed().as_secs()
                ));
                tokio::time::sleep(AFTERMATH).await;
            }
            Err(err) => progress.line(format!("the SLO did not hold again: {err:#}")),
        }
    }
    let _ = stop_tx.send(true);
    let outcome = load.await??;
    let active = sampler.await?;
    let to = Timestamp::now();
    Ok(Played {
        outcome,
        tiers,
        active,
        from,
        to,
    })
}

/// The buyers of the plan, against `gateway`, with the run's keys.
fn buyers_config(
    plan: &Plan,
    gateway: &str,
    keys: &Keys,
    seed: u64,
    profile: buyers::Profile,
) -> buyers::Config {
    buyers::Config {
        gateway: gateway.to_owned(),
        jwt_secret: keys.jwt.clone(),
        payment_secret: keys.payment.clone(),
        skus: plan
            .items
            .iter()
            .map(|i| buyers::SkuLimit {
                sku: i.sku.clone(),
                limit: u64::try_from(i.per_user_limit).unwrap_or(1),
            })
            .collect(),
        users: plan.users,
        profile,
        think: plan.think,
        seed,
        ..buyers::Config::default()
    }
}

/// Samples the active buyers every second until `stopped` turns true, and
/// returns the samples as (Unix milliseconds, buyers).
fn sample_active(
    live: buyers::Counters,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<Vec<(i64, f64)>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut every = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = every.tick() => samples.push((Timestamp::now().as_millisecond(), live.active() as f64)),
                _ = stopped.wait_for(|stop| *stop) => return samples,
            }
        }
    })
}

/// Follows the load: logs each tier the policy takes, requests the drill
/// once the load is in its `tail` (from the start of the load) and the
/// tiers are back to 0, or three minutes later regardless, then waits for
/// the drill's run to end. The run is `None` when it did not end within
/// three minutes.
async fn follow_load(
    client: &Client,
    ns: &str,
    plan: &Plan,
    progress: &Progress,
    load_started: Instant,
    tail: Duration,
) -> anyhow::Result<(TierLog, Option<RunRecord>)> {
    let policies: Api<DegradationPolicy> = Api::namespaced(client.clone(), ns);
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
    let mut tiers = TierLog::default();
    let mut drill_requested = None;
    let tail_deadline = tail + Duration::from_secs(180);
    let run = loop {
        record_tier(&policies, plan, &mut tiers, progress).await;
        let elapsed = load_started.elapsed();
        match drill_requested {
            None if elapsed >= tail
                && (tiers.changes.last().is_some_and(|c| c.tier == 0)
                    || elapsed >= tail_deadline) =>
            {
                request_drill(&drills, plan, progress).await?;
                drill_requested = Some(Instant::now());
            }
            Some(asked) => {
                let status = drills.get(&plan.sale).await?.status.unwrap_or_default();
                if let Some(run) = status.history.first() {
                    progress.line(format!("drill ended: {}", checks::run_text(run)));
                    break Some(run.clone());
                }
                if asked.elapsed() > Duration::from_secs(180) {
                    progress.line("the drill did not end within 3 minutes");
                    break None;
                }
            }
            None => {}
        }
        tokio::time::sleep(TICK).await;
    };
    Ok((tiers, run))
}

/// Reads the policy and logs its tier when it changed; a failed read is
/// skipped (the next tick reads it again).
async fn record_tier(
    policies: &Api<DegradationPolicy>,
    plan: &Plan,
    tiers: &mut TierLog,
    progress: &Progress,
) {
    let Ok(policy) = policies.get(&plan.sale).await else {
        return;
    };
    let status = policy.status.unwrap_or_default();
    if let Some(change) = tiers.record(&status, Timestamp::now()) {
        let load = change.value.map_or(String::new(), |v| {
            format!(", load {v:.2} of the planned peak")
        });
        progress.line(format!(
            "tier {} at {} ({}{load})",
            change.tier,
            checks::time_of_day(change.at),
            change.reason
        ));
    }
}

/// Creates the library's guard check for the sale, asking for a run inside
/// a window opened now.
async fn request_drill(
    drills: &Api<ChaosDrill>,
    plan: &Plan,
    progress: &Progress,
) -> anyhow::Result<()> {
    let now = Timestamp::now();
    let request = format!("play-{}", now.as_second());
    let drill: ChaosDrill = serde_json::from_value(plan.drill(now, &request)?)?;
    drills
        .create(&PostParams::default(), &drill)
        .await
        .context("creating the drill")?;
    let (start, end) = plan::window_from(now);
    progress.line(format!(
        "drill requested inside the window {start}–{end} UTC: fail one of the two gateways until the guard ends it"
    ));
    Ok(())
}

/// The random keys of a run.
struct Keys {
    jwt: Vec<u8>,
    payment: Vec<u8>,
}

/// Makes the namespace ready: the previous run's sale, policy and drill
/// deleted (the sale with its pods), then fresh Secrets.
async fn prepare(client: &Client, ns: &str, plan: &Plan, database: &str) -> anyhow::Result<Keys> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(ns).await?.is_none() {
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.to_owned()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces.create(&PostParams::default(), &object).await?;
    }
    delete_and_wait::<ChaosDrill>(client, ns, &plan.sale).await?;
    delete_and_wait::<DegradationPolicy>(client, ns, &plan.sale).await?;
    delete_and_wait::<FlashSale>(client, ns, &plan.sale).await?;
    let keys = Keys {
        jwt: random_key(),
        payment: random_key(),
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let queue = random_key();
    for (what, key, value) in [
        ("jwt", "key", keys.jwt.clone()),
        ("payment", "key", keys.payment.clone()),
        ("queue", "key", queue),
        ("db", "url", database.as_bytes().to_vec()),
    ] {
        let name = plan.secret(what);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(key.to_owned(), ByteString(value))])),
            ..Secret::default()
        };
        secrets
            .patch(
                &name,
                &PatchParams::apply("flashsale-play").force(),
                &Patch::Apply(&secret),
            )
            .await
            .with_context(|| format!("writing Secret {name}"))?;
    }
    Ok(keys)
}

/// 32 random bytes as 64 hex digits: the workloads trim their secret files,
/// so raw bytes that begin or end with whitespace would come out shorter
/// than the 32 bytes they require (and the keys would differ from ours).
fn random_key() -> Vec<u8> {
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    key.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .into_bytes()
}

/// Deletes `name` (foreground, so a sale's pods go first) and waits until
/// it is gone.
async fn delete_and_wait<K>(client: &Client, ns: &str, name: &str) -> anyhow::Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    if api.get_opt(name).await?.is_none() {
        return Ok(());
    }
    api.delete(name, &DeleteParams::foreground()).await?;
    poll_until(
        &format!(
            "the previous {} {name} is gone",
            K::kind(&K::DynamicType::default())
        ),
        Duration::from_secs(180),
        TICK,
        || async {
            match api.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    Ok(())
}

/// Waits until the sale is Ready and Live, telling the phases as they come.
async fn await_live(
    sales: &Api<FlashSale>,
    plan: &Plan,
    progress: &Progress,
) -> anyhow::Result<()> {
    poll_until(
        "the sale is Ready and Live",
        plan.opens_in + Duration::from_secs(240),
        TICK,
        || async {
            let sale = sales.get(&plan.sale).await.map_err(|e| e.to_string())?;
            let status = sale.status.unwrap_or_default();
            let condition = status.observed.get("Ready");
            let ready = status.observed.is_true("Ready");
            // Why not, in the operator's words (e.g. pods unschedulable).
            let now = format!(
                "phase {:?}, workloads ready {}; {}",
                status.phase,
                status.ready_workloads.as_deref().unwrap_or("-"),
                condition.map_or("no Ready condition yet".to_owned(), |c| format!(
                    "Ready {} {}: {}",
                    c.status, c.reason, c.message
                ))
            );
            if ready && status.phase == Some(SalePhase::Live) {
                Ok(())
            } else {
                Err(now)
            }
        },
    )
    .await?;
    progress.line("the sale is live and every workload is ready");
    Ok(())
}

/// Waits until Prometheus scrapes both gateways, so the policy and the
/// drill's guard see the sale from its first request.
async fn await_scraped(
    prometheus: &prometheus_http_query::Client,
    plan: &Plan,
    ns: &str,
) -> anyhow::Result<()> {
    let query = plan.slo_query(ns);
    poll_until(
        "Prometheus scrapes both gateways",
        Duration::from_secs(60),
        TICK,
        || async {
            let answer = prometheus
                .query(query.as_str())
                .get()
                .await
                .map_err(|e| e.to_string())?;
            let up: f64 = answer
                .data()
                .as_vector()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|v| v.sample().value())
                .sum();
            if up >= 2.0 {
                Ok(())
            } else {
                Err(format!("{up} gateways up"))
            }
        },
    )
    .await?;
    Ok(())
}

/// The port of the sale's gateway Service.
const GATEWAY_PORT: u16 = 80;

/// Ends the sale now and waits until it has drained: unpaid reservations
/// returned at `end + reservationTTL`, the order-writer's lag read as 0.
async fn end_sale(sales: &Api<FlashSale>, plan: &Plan, progress: &Progress) -> anyhow::Result<()> {
    let end = Timestamp::now() + Duration::from_secs(2);
    sales
        .patch(
            &plan.sale,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"schedule": {"end": end.to_string()}}})),
        )
        .await
        .context("moving the sale's end to now")?;
    poll_until(
        "the sale has drained",
        plan.reservation_ttl + Duration::from_secs(180),
        TICK,
        || async {
            let sale = sales.get(&plan.sale).await.map_err(|e| e.to_string())?;
            let status = sale.status.unwrap_or_default();
            match status.observed.get("Drained") {
                Some(c) if c.status == "True" => Ok(()),
                other => Err(format!(
                    "phase {:?}, Drained {}",
                    status.phase,
                    other.map_or("absent".to_owned(), |c| format!(
                        "{} {}: {}",
                        c.status, c.reason, c.message
                    ))
                )),
            }
        },
    )
    .await?;
    progress.line("the sale ended and drained: reservations settled, order-writer lag 0");
    Ok(())
}

/// Writes the report, the checks as JUnit XML, the result and the ledger.
fn write_outputs(
    dir: &Path,
    report: &Report,
    outcome: &Outcome,
    ledger: &buyers::Ledger,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    write(REPORT_FILE, crate::report::render_html(report))?;
    write(
        JUNIT_FILE,
        crate::report::render_junit("flashsale-scenario", &outcome.checks, outcome.seconds),
    )?;
    write(RESULT_FILE, serde_json::to_string_pretty(outcome)?)?;
    write("ledger.json", serde_json::to_string_pretty(ledger)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_survive_the_workloads_trimming_their_secret_files() {
        for _ in 0..1000 {
            let key = super::random_key();
            assert_eq!(key.len(), 64);
            assert_eq!(key.trim_ascii(), key.as_slice());
            assert!(key.iter().all(u8::is_ascii_hexdigit));
        }
        assert_ne!(super::random_key(), super::random_key());
    }
}
