//! A sale on the local stack's real node (kubelet, containerd, CNI,
//! kube-proxy, cluster DNS) and the waits its tests share: pods that really
//! run from the project's images and Prometheus really scraping them.

use std::{collections::BTreeSet, time::Duration};

use crate::{
    kafka,
    stack::{self, unique_name},
    wait::poll_until,
};
use flashsale_api::{ChaosDrill, FlashSale, chaosdrill::RunRecord};
use flashsale_observe::pods::is_ready;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::core::v1::{Pod, Secret, Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};

use crate::{kube::create_secret as secret, reach::Reach, sales::condition, stores::Stores};

/// Pods start in seconds, but a loaded two-core machine starting a dozen
/// containers at once can take a minute.
pub const START: Duration = Duration::from_secs(180);

/// How often the waits look again.
pub const TICK: Duration = Duration::from_millis(250);

/// The label and taint that keep everything else off the real node.
pub const REAL_NODE_KEY: &str = "flashsale.dev/real-node";

/// What `secret()` puts in every test Secret.
pub const HS256_SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

/// The project's image `name` at this build's version, as the stack
/// imports it into the real node's containerd.
pub fn image(name: &str) -> String {
    format!("ghcr.io/flashsale-dev/{name}:{}", env!("CARGO_PKG_VERSION"))
}

/// Tags the real node's image `from` as `to` too (the same bits under a
/// new tag, as a release of a new version would bring a new tag).
pub fn tag_image(from: &str, to: &str) -> anyhow::Result<()> {
    let out = std::process::Command::new("ctr")
        .args(["--address", &stack::containerd_address()?, "-n", "k8s.io"])
        .args(["images", "tag", "--force", from, to])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "ctr images tag {from} {to}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The FlashSale placement that puts a workload on the real node.
pub fn placement() -> Value {
    json!({
        "nodeSelector": {REAL_NODE_KEY: "true"},
        "tolerations": [{"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    })
}

/// Resources small enough that several sales fit on one two-core node.
pub fn small() -> Value {
    json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}})
}

/// What each test sale is made of.
pub struct Sale {
    /// The FlashSale's name.
    pub name: String,
    /// Its orders topic.
    pub topic: String,
}

/// Where a sale keeps its stock and its orders: its stores as pods reach
/// them, the Kafka this run creates its topics on, and its orders topic.
#[derive(Debug, Clone)]
pub struct SaleStores {
    /// The Redis of its stock (`redis://`).
    pub redis: String,
    /// The order database (`postgres://`).
    pub database: String,
    /// The Kafka brokers its pods publish to and consume from.
    pub kafka: String,
    /// The same Kafka as this run reaches it.
    pub kafka_here: String,
    /// Its orders topic (its dead letters go to `<topic>.dlq`).
    pub topic: String,
    /// Whether creating the sale creates its topics, or finds them made
    /// (a mirror's, made before its source's sale existed).
    pub create_topics: bool,
}

impl SaleStores {
    /// The stack's stores, and a topic of the sale's own.
    pub fn stack() -> anyhow::Result<Self> {
        Ok(Self {
            redis: stack::in_cluster::redis_url()?,
            database: stack::in_cluster::database_url()?,
            kafka: stack::in_cluster::kafka_brokers()?,
            kafka_here: stack::kafka_brokers()?,
            topic: unique_name("orders"),
            create_topics: true,
        })
    }

    /// Region `region`'s stores (`a` or `b`, from the Secret `stores` the
    /// stack writes in `flashsale-region-<region>`), with the orders topic
    /// `topic`, on the Kafka this run reaches at `kafka_here`.
    pub async fn region(
        client: &Client,
        region: &str,
        (kafka_here, topic): (&str, &str),
    ) -> anyhow::Result<Self> {
        let namespace = format!("flashsale-region-{region}");
        let stores = Stores::discover_in(client, &namespace, Reach::ServiceIp).await?;
        Ok(Self {
            redis: stores.in_cluster.redis,
            database: stores.in_cluster.database,
            kafka: stores.in_cluster.kafka_brokers,
            kafka_here: kafka_here.to_owned(),
            topic: topic.to_owned(),
            create_topics: true,
        })
    }
}

/// A sale on the real node that opens in `opens_in` (warming up until then),
/// with its own Kafka topics, reaching the stack's stores through the
/// `flashsale-stack` Services: 10 units of `CASE`, at most 3 per buyer.
pub async fn create_sale(
    client: &Client,
    ns: &str,
    opens_in: SignedDuration,
) -> anyhow::Result<Sale> {
    create_stocked_sale(client, ns, opens_in, 10).await
}

/// [`create_sale`] with `stock` units of `CASE`.
pub async fn create_stocked_sale(
    client: &Client,
    ns: &str,
    opens_in: SignedDuration,
    stock: u32,
) -> anyhow::Result<Sale> {
    create_sale_as(client, ns, (opens_in, stock), &SaleStores::stack()?, None).await
}

/// [`create_sale`] in `stores` rather than the stack's.
pub async fn create_sale_in(
    client: &Client,
    ns: &str,
    opens_in: SignedDuration,
    stores: &SaleStores,
) -> anyhow::Result<Sale> {
    create_sale_as(client, ns, (opens_in, 10), stores, None).await
}

/// [`create_sale_in`] as another region's FlashSale of the sale with id
/// `sale_id` and drill key `drill_key` (in the Secret `drill`, named by
/// its `spec.gateway.drillKeySecretRef`).
pub async fn create_standby_sale(
    client: &Client,
    ns: &str,
    (opens_in, stores): (SignedDuration, &SaleStores),
    (sale_id, drill_key): (&str, &[u8]),
) -> anyhow::Result<Sale> {
    let drill: Secret = serde_json::from_value(json!({
        "metadata": {"name": "drill"},
        "data": {"key": k8s_openapi::ByteString(drill_key.to_vec())}
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &drill)
        .await?;
    create_sale_as(client, ns, (opens_in, 10), stores, Some(sale_id)).await
}

async fn create_sale_as(
    client: &Client,
    ns: &str,
    (opens_in, stock): (SignedDuration, u32),
    stores: &SaleStores,
    standby_of: Option<&str>,
) -> anyhow::Result<Sale> {
    let name = "real".to_owned();
    let topic = stores.topic.clone();
    let dlq = format!("{topic}.dlq");
    if stores.create_topics {
        kafka::create_topic(&stores.kafka_here, &topic, 3).await?;
        kafka::create_topic(&stores.kafka_here, &dlq, 1).await?;
    }
    secret(client, ns, "jwt", "hs256").await?;
    let db = Secret {
        metadata: ObjectMeta {
            name: Some("db".into()),
            ..ObjectMeta::default()
        },
        string_data: Some([("url".to_owned(), stores.database.clone())].into()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &db)
        .await?;
    let start = Timestamp::now() + opens_in;
    let object = json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "FlashSale",
        "metadata": {"name": name},
        "spec": {
            "schedule": {
                "start": start.to_string(),
                "end": (start + SignedDuration::from_hours(1)).to_string(),
                "warmUp": "2h"
            },
            // Its own region, so an answer names the namespace that served it.
            "region": ns,
            "reservationTTL": "5m",
            "placement": placement(),
            "items": [{"sku": "CASE", "stock": stock, "perUserLimit": 3, "priceMinor": 1900}],
            "gateway": {
                "replicas": 2,
                "resources": small(),
                "auth": {"hs256SecretRef": {"name": "jwt", "key": "hs256"}}
            },
            "inventory": {
                "replicas": 1,
                "resources": small(),
                "redis": {"url": stores.redis}
            },
            "orderWriter": {
                "replicas": 1,
                "resources": small(),
                "kafka": {
                    "brokers": [stores.kafka],
                    "topic": topic,
                    "dlqTopic": dlq
                },
                "database": {"driver": "postgres", "urlSecretRef": {"name": "db", "key": "url"}}
            }
        }
    });
    let mut sale: FlashSale = serde_json::from_value(object)?;
    if let Some(sale_id) = standby_of {
        sale.spec.sale_id = Some(sale_id.to_owned());
        sale.spec.gateway.drill_key_secret_ref = Some(serde_json::from_value(
            json!({"name": "drill", "key": "key"}),
        )?);
    }
    Api::<FlashSale>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sale)
        .await?;
    Ok(Sale { name, topic })
}

/// The flags of an operator running sales on the real node: the test
/// images are its defaults, anything else under the project's image prefix
/// is allowed (for the failure cases), its guards read the stack's
/// Prometheus, and its lease tolerates the stalls of a machine running
/// faults on the real node.
pub fn operator_flags() -> anyhow::Result<Vec<String>> {
    let mut flags: Vec<String> = [
        "--allowed-image",
        "ghcr.io/flashsale-dev/",
        "--prometheus-url",
        &stack::prometheus_url()?,
    ]
    .map(str::to_owned)
    .to_vec();
    flags.extend(REAL_NODE_LEASE.map(str::to_owned));
    Ok(flags)
}

/// Lease timings for the real node's operators. The tests' fast lease
/// (renewals due within 3 s) lost the lease, and with it a drill's run,
/// when a loaded apiserver answered a renewal late; no real-node test races
/// two operators, and a killed one's lease still expires well within the
/// time a test gives its successor to lead.
const REAL_NODE_LEASE: [&str; 6] = [
    "--lease-duration",
    "10s",
    "--lease-renew-deadline",
    "8s",
    "--lease-retry-period",
    "1s",
];

/// Waits until the sale's `type_` condition is `status` with a reason
/// `reason` accepts.
pub async fn await_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: impl Fn(&str) -> bool,
) -> anyhow::Result<FlashSale> {
    let sales: Api<FlashSale> = Api::namespaced(client.clone(), ns);
    Ok(
        poll_until(&format!("{name} {type_}={status}"), START, TICK, || {
            let sales = sales.clone();
            let reason = &reason;
            async move {
                let sale = sales.get(name).await.map_err(|e| e.to_string())?;
                match condition(&sale, type_) {
                    Some((s, r, _)) if s == status && reason(&r) => Ok(sale),
                    other => Err(format!("{type_}: {other:?}")),
                }
            }
        })
        .await?,
    )
}

/// Waits until the sale `name` is Ready.
pub async fn await_ready(client: &Client, ns: &str, name: &str) -> anyhow::Result<FlashSale> {
    await_condition(client, ns, name, "Ready", "True", |_| true).await
}

/// The sale's ready pods of one component, with their uids.
pub async fn ready_pods(
    client: &Client,
    ns: &str,
    sale: &str,
    component: &str,
) -> anyhow::Result<Vec<Pod>> {
    let selector =
        format!("app.kubernetes.io/part-of={sale},app.kubernetes.io/component={component}");
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
        .collect())
}

/// The uids of `pods`.
pub fn uids(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter().filter_map(|p| p.uid()).collect()
}

/// A buyer's token for `user`, valid for an hour.
pub fn token(user: &str) -> anyhow::Result<String> {
    token_expiring(user, Timestamp::now().as_second() + 3600)
}

/// A buyer's token for `user` that expires at `exp` (Unix seconds).
pub fn token_expiring(user: &str, exp: i64) -> anyhow::Result<String> {
    token_signed(user, exp, HS256_SECRET)
}

/// A buyer's token for `user` that expires at `exp` (Unix seconds), signed
/// with the sale's HS256 key `secret`.
pub fn token_signed(user: &str, exp: i64, secret: &[u8]) -> anyhow::Result<String> {
    let claims = json!({"sub": user, "exp": exp});
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret)?,
    )?)
}

/// An HTTP client for the pods, with a 5 s timeout.
pub fn http() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?)
}

/// An HTTP client for the pods, with a 5 s timeout, that opens a new
/// connection for every request, as many buyers' devices do: behind a
/// Service each lands on a pod of its own choosing, not on the one a
/// kept-alive connection happens to hold.
pub fn http_per_request() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
}

/// Shoppers viewing pages, ten views a second at each URL, each view its
/// own user, until dropped (and never past five minutes). A view is not
/// waited for: a slow answer must not slow the views.
pub struct PageViews(tokio::task::JoinHandle<()>);

impl Drop for PageViews {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Views of `path` on every one of `gateways`, by pod IP.
pub fn page_views(gateways: &[Pod], path: &str) -> anyhow::Result<PageViews> {
    let urls = gateways
        .iter()
        .map(|g| Ok(format!("http://{}:8080{path}", pod_ip(g)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    views_of(urls)
}

/// Views of each of `urls`.
pub fn views_of(urls: Vec<String>) -> anyhow::Result<PageViews> {
    let client = http()?;
    Ok(PageViews(tokio::spawn(async move {
        let until = std::time::Instant::now() + Duration::from_secs(300);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut views = 0u64;
        while std::time::Instant::now() < until {
            tick.tick().await;
            for url in &urls {
                views += 1;
                if let Ok(buyer) = token(&format!("viewer-{views}")) {
                    tokio::spawn(client.get(url).bearer_auth(buyer).send());
                }
            }
        }
    })))
}

/// What Prometheus's pod discovery currently scrapes for the namespace:
/// pod name → health.
pub async fn scraped(ns: &str) -> Result<Vec<(String, String)>, String> {
    let data = crate::prometheus::api_get("/api/v1/targets", &[("state", "active")]).await?;
    Ok(data["activeTargets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["labels"]["namespace"] == ns)
        .filter_map(|t| {
            Some((
                t["labels"]["pod"].as_str()?.to_owned(),
                t["health"].as_str()?.to_owned(),
            ))
        })
        .collect())
}

/// Waits until Prometheus scrapes every one of `gateways` and finds it up.
pub async fn await_scraped_and_up(ns: &str, gateways: &[Pod]) -> anyhow::Result<()> {
    poll_until("both gateways scraped and up", START, TICK, || async {
        let targets = scraped(ns).await?;
        let up = |pod: &Pod| targets.contains(&(pod.name_any(), "up".to_owned()));
        if gateways.iter().all(up) {
            Ok(())
        } else {
            Err(format!("{targets:?}"))
        }
    })
    .await?;
    Ok(())
}

/// Waits until the sale has `count` ready gateway pods; `what` names the
/// wait in a timeout.
pub async fn await_ready_gateways(
    client: &Client,
    ns: &str,
    sale: &str,
    count: usize,
    what: &str,
) -> anyhow::Result<()> {
    poll_until(what, START, TICK, || async {
        let now = ready_pods(client, ns, sale, "gateway")
            .await
            .map_err(|e| e.to_string())?;
        (now.len() == count)
            .then_some(())
            .ok_or(format!("{} ready", now.len()))
    })
    .await?;
    Ok(())
}

/// The sale's live gateways as Prometheus sees them: the SLO a drill on the
/// real node guards.
pub fn gateways_up(ns: &str, sale: &str) -> String {
    format!(r#"count(up{{namespace="{ns}", pod=~"{sale}-gateway-.*"}} == 1)"#)
}

/// The ended run of the drill `name`.
pub async fn ended_run(drills: &Api<ChaosDrill>, name: &str) -> anyhow::Result<RunRecord> {
    Ok(poll_until("the run ended", START, TICK, || async {
        let drill = drills.get(name).await.map_err(|e| e.to_string())?;
        let status = drill.status.unwrap_or_default();
        status
            .history
            .first()
            .cloned()
            .ok_or(format!("{:?}", status.phase))
    })
    .await?)
}

/// A drill of `sale` named `name`, asked to run now: one experiment on at
/// most one pod (and half the fleet), guarded every 250 ms by one
/// objective.
pub fn run_now_drill(
    name: &str,
    sale: &str,
    experiment: Value,
    objective: Value,
) -> anyhow::Result<ChaosDrill> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "ChaosDrill",
        "metadata": {"name": name, "annotations": {"flashsale.dev/run-now": "first"}},
        "spec": {
            "saleRef": {"name": sale},
            "schedule": {"cron": "0 0 1 1 *", "timeZone": "UTC"},
            "experiments": [experiment],
            "blastRadius": {"maxPercent": 50, "maxPods": 1},
            "sloGuard": {
                "objectives": [objective],
                "interval": "250ms", "staleAfter": "10s", "steadyState": "2s"
            }
        }
    }))?)
}

/// The pod IP of `pod`.
pub fn pod_ip(pod: &Pod) -> anyhow::Result<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or_else(|| anyhow::anyhow!("{} has no pod IP", pod.name_any()))
}

/// The value of the instant `query` at the stack's Prometheus: `None`
/// when it returns no series.
pub async fn prometheus_value(query: &str) -> Result<Option<f64>, String> {
    let base = stack::prometheus_url().map_err(|e| e.to_string())?;
    crate::prometheus::value_at(&base, query).await
}

/// Waits until the instant `query` answers a value below `bound` (the
/// quiet baseline a fault test starts from); `what` names the wait.
pub async fn await_below(what: &str, query: &str, bound: f64) -> anyhow::Result<()> {
    poll_until(what, START, TICK, || async {
        match prometheus_value(query).await? {
            Some(value) if value < bound => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

/// The cluster IP of Service `service`.
pub async fn cluster_ip(client: &Client, ns: &str, service: &str) -> anyhow::Result<String> {
    Api::<Service>::namespaced(client.clone(), ns)
        .get(service)
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| anyhow::anyhow!("Service {service} has no cluster IP"))
}

/// What chaos still does to the pods of namespace `ns`, as the node's
/// residue check finds it; empty when they are clean.
pub async fn residue(client: &Client, ns: &str) -> anyhow::Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(crate::inside::residue_of(&pods.items)?)
}
