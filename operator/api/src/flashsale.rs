//! `FlashSale`: one sale, its items and the three workloads that run it.

// Each `printcolumn(...)` repeats the same keys, which this lint mistakes for duplicates.
// Start and End are strings, not dates: kubectl shows a future date as "<invalid>".
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    common::{ObservedConditions, Placement, SecretKeyRef, WorkloadSpec},
    duration::{self, Duration},
};

/// A flash sale: when it runs, what it sells, and how its gateway, inventory
/// and order-writer are deployed. The operator warms the workloads up before
/// `schedule.start`, opens the sale at `start` and closes it at `end`.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "flashsale.dev",
    version = "v1alpha1",
    kind = "FlashSale",
    plural = "flashsales",
    shortname = "fs",
    category = "flashsale",
    namespaced,
    derive = "PartialEq",
    status = "FlashSaleStatus",
    doc = "A flash sale: its schedule, items and workloads.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Start", type_ = "string", json_path = ".spec.schedule.start"),
    printcolumn(name = "End", type_ = "string", json_path = ".spec.schedule.end"),
    printcolumn(name = "Stock Left", type_ = "integer", json_path = ".status.stockLeft"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.readyWorkloads"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new(
        "!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ['Live', 'Ended']) || \
         (self.spec.schedule.start == oldSelf.spec.schedule.start && \
          self.spec.items.map(i, i.sku) == oldSelf.spec.items.map(i, i.sku))"
    )
    .message("spec.schedule.start and spec.items[*].sku cannot change once the sale is Live")
    .reason(Reason::FieldValueForbidden),
    // The longest child name is `<sale>-order-writer`, and Service names are
    // DNS labels of at most 63 characters.
    validation = Rule::new("size(self.metadata.name) <= 50")
        .message("metadata.name of a FlashSale must be at most 50 characters (its children append up to 13)")
        .reason(Reason::FieldValueInvalid),
    // The stock, the events and the rows are kept under the sale id: another
    // id is another sale, and the stock sold under this one would be lost.
    validation = Rule::new(
        "has(self.spec.saleID) == has(oldSelf.spec.saleID) && \
         (!has(self.spec.saleID) || self.spec.saleID == oldSelf.spec.saleID)"
    )
    .message("spec.saleID cannot be set, changed or removed after the sale is created")
    .reason(Reason::FieldValueForbidden)
)]
#[serde(rename_all = "camelCase")]
pub struct FlashSaleSpec {
    /// When the sale runs.
    pub schedule: SaleSchedule,
    /// What is sold. SKUs are unique.
    #[schemars(length(min = 1, max = 200))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["sku".into()]))]
    pub items: Vec<SaleItem>,
    /// ISO 4217 currency of every `priceMinor`.
    #[serde(default = "default_currency")]
    #[schemars(regex(pattern = r"^[A-Z]{3}$"))]
    pub currency: String,
    /// How long a reservation may stay unpaid before its stock returns.
    #[serde(default = "default_reservation_ttl", rename = "reservationTTL")]
    #[x_kube(validation = duration::positive().message("reservationTTL must be positive"))]
    pub reservation_ttl: Duration,
    /// The region this sale runs in: a label for dashboards and failover,
    /// stamped by the gateway on every answer (`flashsale-region`), so a
    /// label value's characters.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$")
    )]
    pub region: String,
    /// The id the workloads know the sale by: its Redis keys, its order
    /// events and rows, its buyers' request ids. Set the same id on each
    /// region's FlashSale of one sale, so a standby sells from the stock
    /// replicated from the primary and a buyer's retry in another region is
    /// the same order. Absent: `<namespace>.<name>.<first 8 hex digits of
    /// metadata.uid>`, so a sale created again starts from nothing. Fixed
    /// at creation.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "saleID")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"))]
    pub sale_id: Option<String>,
    /// A warm-standby peer that can take the sale over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<StandbyPeer>,
    /// Which nodes every pod of the sale may run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// The public entry: token check, rate limit, waiting room, adaptive
    /// concurrency.
    pub gateway: GatewaySpec,
    /// Stock reservations in Redis.
    pub inventory: InventorySpec,
    /// Kafka → SQL order persistence.
    pub order_writer: OrderWriterSpec,
}

fn default_currency() -> String {
    "USD".to_owned()
}

fn default_reservation_ttl() -> Duration {
    Duration::from_secs(15 * 60)
}

/// When the sale runs.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.end > self.start").message("schedule.end must be after schedule.start"))]
pub struct SaleSchedule {
    /// Opening time (RFC 3339).
    pub start: Time,
    /// Closing time (RFC 3339), after `start`.
    pub end: Time,
    /// How long before `start` the workloads scale to live size and the
    /// inventory is loaded.
    #[serde(default = "default_warm_up")]
    pub warm_up: Duration,
}

fn default_warm_up() -> Duration {
    Duration::from_secs(10 * 60)
}

/// One SKU on sale.
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SaleItem {
    /// Stock-keeping unit, unique within the sale.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"))]
    #[schemars(length(max = 64))]
    pub sku: String,
    /// Units for sale.
    #[schemars(range(min = 0))]
    pub stock: i64,
    /// Most units one user may buy.
    #[serde(default = "default_per_user_limit")]
    #[schemars(range(min = 1))]
    pub per_user_limit: i32,
    /// Price in minor units of `currency` (cents, fen).
    #[schemars(range(min = 0))]
    pub price_minor: i64,
    /// Redis keys the stock is split over, to spread a hot SKU's load.
    #[serde(default = "default_shards")]
    #[schemars(range(min = 1, max = 64))]
    pub shards: i32,
}

fn default_per_user_limit() -> i32 {
    1
}

fn default_shards() -> i32 {
    1
}

/// A standby region that can take the sale over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandbyPeer {
    /// Region of the standby.
    #[schemars(length(min = 1, max = 63))]
    pub region: String,
    /// Base URL of the standby's gateway, probed for readiness.
    #[serde(rename = "gatewayURL")]
    #[schemars(length(min = 1, max = 512))]
    pub gateway_url: String,
}

/// The gateway workload.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// Replicas, image and resources.
    #[serde(flatten)]
    pub workload: WorkloadSpec,
    /// How buyers' bearer tokens (JWT) are verified.
    pub auth: GatewayAuth,
    /// How the payment provider's callbacks are verified. Without it the
    /// gateway cannot verify a callback, so no payment confirms an order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment: Option<GatewayPayment>,
    /// The drill key (at least 32 bytes) drill buyers' tokens are checked
    /// with, when every region's sale of one `saleID` must take the same
    /// drill buyers: the same Secret in each region. Absent: the
    /// `drill-buyer-key` the operator made in the sale's internal Secret.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "drillKeySecretRef"
    )]
    pub drill_key_secret_ref: Option<SecretKeyRef>,
    /// The gateway's own Redis login (rate limit and waiting room), for a
    /// Redis user that reaches only the gateway's keys (`inventory
    /// redis-acl` prints the rules). Absent: the inventory's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisSpec>,
    /// Scale on CPU between bounds instead of a fixed `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// Per-user GCRA rate limit.
    #[serde(default)]
    pub rate_limit: RateLimit,
    /// Virtual waiting room in front of checkout.
    #[serde(default)]
    pub waiting_room: WaitingRoom,
    /// Adaptive concurrency limit bounds.
    #[serde(default)]
    pub concurrency: ConcurrencyLimit,
}

/// How the gateway verifies bearer tokens: exactly one key source, and
/// optionally the issuer and audience every token must name.
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.hs256SecretRef) != has(self.rs256PublicKeySecretRef)").message("gateway.auth needs exactly one of hs256SecretRef and rs256PublicKeySecretRef"))]
pub struct GatewayAuth {
    /// A Secret key holding the HS256 signing secret (at least 32 bytes).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "hs256SecretRef"
    )]
    pub hs256_secret_ref: Option<SecretKeyRef>,
    /// A Secret key holding the issuer's RSA public key (PEM), for RS256.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "rs256PublicKeySecretRef"
    )]
    pub rs256_public_key_secret_ref: Option<SecretKeyRef>,
    /// The `iss` claim every token must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub issuer: Option<String>,
    /// The `aud` claim every token must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub audience: Option<String>,
}

/// The payment provider's side of the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPayment {
    /// A Secret key holding the provider's callback signing secret (the
    /// HMAC-SHA256 key of the `Flashsale-Signature` header).
    pub secret_ref: SecretKeyRef,
}

/// Horizontal autoscaling of the gateway.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.maxReplicas >= self.minReplicas").message("autoscaling.maxReplicas must be at least minReplicas"))]
pub struct Autoscaling {
    /// Fewest replicas.
    #[schemars(range(min = 1))]
    pub min_replicas: i32,
    /// Most replicas.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
    /// Target average CPU utilisation, percent of requests.
    #[serde(default = "default_cpu_target", rename = "targetCPUUtilizationPercent")]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization_percent: i32,
}

fn default_cpu_target() -> i32 {
    70
}

/// Per-user rate limit (GCRA): a sustained rate with a burst allowance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    /// Sustained requests per second per user, above 0.
    #[schemars(range(min = 0.0, max = 100000.0), extend("exclusiveMinimum" = true))]
    pub per_user_per_second: f64,
    /// Requests a user may send at once above the sustained rate.
    #[schemars(range(min = 1, max = 100000))]
    pub burst: i32,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            per_user_per_second: 5.0,
            burst: 10,
        }
    }
}

/// Virtual waiting room.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.enabled || has(self.ticketSecretRef)").message("waitingRoom.ticketSecretRef is required when the waiting room is enabled"))]
#[x_kube(validation = Rule::new("!has(self.botShield) || has(self.ticketSecretRef)").message("waitingRoom.ticketSecretRef is required by botShield: it signs the challenges"))]
pub struct WaitingRoom {
    /// Whether buyers queue before checkout.
    #[serde(default)]
    pub enabled: bool,
    /// Users admitted per second, across all gateway replicas.
    #[serde(default = "default_admit_per_second")]
    #[schemars(range(min = 1, max = 1000000))]
    pub admit_per_second: i32,
    /// The HMAC key that signs queue tickets and passes, and the bot
    /// shield's challenges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket_secret_ref: Option<SecretKeyRef>,
    /// How long an admitted user's checkout pass stays valid.
    #[serde(default = "default_pass_ttl", rename = "passTTL")]
    #[x_kube(validation = duration::positive().message("waitingRoom.passTTL must be positive"))]
    pub pass_ttl: Duration,
    /// A proof of work in front of the queue's join (or, with the room
    /// off, of every order), whose cost follows the degradation tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bot_shield: Option<BotShield>,
}

impl WaitingRoom {
    /// Whether the gateway signs with `ticketSecretRef`: for the room's
    /// tickets and passes, or for the bot shield's challenges.
    pub fn signs(&self) -> bool {
        self.enabled || self.bot_shield.is_some()
    }
}

/// The bot shield: joining the queue (or, with the room off, ordering)
/// takes a solved proof-of-work challenge, and each source a share of a
/// per-source budget.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BotShield {
    /// Leading zero bits a proof needs, by degradation tier (the
    /// first entry for tier 0); the last entry serves every higher tier.
    /// Each bit doubles the work: 16 bits is about 65,000 SHA-256 hashes.
    #[schemars(length(min = 1, max = 9))]
    #[x_kube(validation = Rule::new("self.all(b, b >= 0 && b <= 32)").message("botShield.difficultyBits entries must be 0-32"))]
    pub difficulty_bits: Vec<i32>,
    /// How long a challenge may be solved and spent.
    #[serde(default = "default_challenge_ttl", rename = "challengeTTL")]
    #[x_kube(validation = duration::positive().message("botShield.challengeTTL must be positive"))]
    pub challenge_ttl: Duration,
    /// Joins (or orders) per source, whatever the accounts behind it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_source: Option<PerSourceBudget>,
}

fn default_challenge_ttl() -> Duration {
    Duration::from_secs(120)
}

/// How many joins (or orders, with the waiting room off) one source may
/// make: the client's address, or the fingerprint a trusted proxy names it
/// by.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PerSourceBudget {
    /// Joins per second one source may make, sustained.
    #[schemars(range(min = 1, max = 1000000))]
    pub joins_per_second: i32,
    /// Joins one source may make back to back.
    #[schemars(range(min = 1, max = 1000000))]
    pub burst: i32,
    /// The header naming the client, a TLS fingerprint such as JA4 that
    /// the edge sets; believed only from `trustedProxies`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$"))]
    pub header: Option<String>,
    /// The proxies, as addresses or CIDRs, whose `header` is believed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 43)))]
    #[x_kube(validation = Rule::new("self.all(p, p.matches('^[0-9a-fA-F.:]+(/[0-9]{1,3})?$'))").message("perSource.trustedProxies entries must be IP addresses or CIDRs"))]
    pub trusted_proxies: Vec<String>,
}

fn default_admit_per_second() -> i32 {
    500
}

fn default_pass_ttl() -> Duration {
    Duration::from_secs(5 * 60)
}

impl Default for WaitingRoom {
    fn default() -> Self {
        Self {
            enabled: false,
            admit_per_second: default_admit_per_second(),
            ticket_secret_ref: None,
            pass_ttl: default_pass_ttl(),
            bot_shield: None,
        }
    }
}

/// Bounds of the adaptive concurrency limit.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.maxLimit >= self.minLimit").message("concurrency.maxLimit must be at least minLimit"))]
pub struct ConcurrencyLimit {
    /// The limit never falls below this.
    #[schemars(range(min = 1))]
    pub min_limit: i32,
    /// The limit never rises above this.
    #[schemars(range(min = 1))]
    pub max_limit: i32,
    /// Percent of the limit kept for tier-0 (checkout) traffic.
    #[serde(default = "default_reserved_percent")]
    #[schemars(range(min = 0, max = 100))]
    pub tier0_reserved_percent: i32,
}

fn default_reserved_percent() -> i32 {
    30
}

impl Default for ConcurrencyLimit {
    fn default() -> Self {
        Self {
            min_limit: 20,
            max_limit: 1000,
            tier0_reserved_percent: default_reserved_percent(),
        }
    }
}

/// The inventory workload and its Redis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventorySpec {
    /// Replicas, image and resources.
    #[serde(flatten)]
    pub workload: WorkloadSpec,
    /// Where stock lives.
    pub redis: RedisSpec,
    /// When a reservation or payment is acknowledged.
    #[serde(default)]
    pub durability: InventoryDurability,
}

/// When the inventory acknowledges a write: the trade between latency and
/// what a Redis failover may lose (`docs/design/inventory.md`, *Durability*).
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryDurability {
    /// `Auto`: `Replicated` where every Redis primary has `replicas`
    /// replicas when the inventory starts, else `Fast`. `Fast`: once the
    /// primary applied it (a failover may lose the last acknowledged
    /// writes). `Replicated`: once `replicas` replicas have it, refused
    /// (retried by the buyer) when they do not confirm within `timeout`.
    #[serde(default)]
    pub mode: DurabilityMode,
    /// Replicas that must confirm a write.
    #[serde(default = "default_durability_replicas")]
    #[schemars(range(min = 1, max = 5))]
    pub replicas: i32,
    /// How long a write waits for them.
    #[serde(default = "default_durability_timeout")]
    #[x_kube(validation = duration::rule(
        &["self"],
        "duration(self) > duration('0s') && duration(self) <= duration('1s')",
    ).message("durability.timeout must be positive and at most 1s"))]
    pub timeout: Duration,
}

fn default_durability_replicas() -> i32 {
    1
}

fn default_durability_timeout() -> Duration {
    Duration::from_millis(50)
}

impl Default for InventoryDurability {
    fn default() -> Self {
        Self {
            mode: DurabilityMode::default(),
            replicas: default_durability_replicas(),
            timeout: default_durability_timeout(),
        }
    }
}

/// See [`InventoryDurability::mode`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DurabilityMode {
    /// Replicated where Redis has the replicas, else fast.
    #[default]
    Auto,
    /// On the primary alone.
    Fast,
    /// On `replicas` replicas too.
    Replicated,
}

impl DurabilityMode {
    /// The inventory's `--durability` value.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Fast => "fast",
            Self::Replicated => "replicated",
        }
    }
}

/// A Redis server, by URL or by a Secret holding the URL (with credentials).
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.url) != has(self.urlSecretRef)").message("redis needs exactly one of url and urlSecretRef"))]
pub struct RedisSpec {
    /// `redis://host:port/db` without credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^rediss?://"), length(max = 512))]
    pub url: Option<String>,
    /// A Secret key holding the full URL, credentials included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_secret_ref: Option<SecretKeyRef>,
}

/// The order-writer workload, its Kafka and its database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderWriterSpec {
    /// Replicas, image and resources.
    #[serde(flatten)]
    pub workload: WorkloadSpec,
    /// Where order events flow.
    pub kafka: KafkaSpec,
    /// Where orders are stored.
    pub database: DatabaseSpec,
}

/// Kafka connection and topics.
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.topic != self.dlqTopic").message("kafka.dlqTopic must differ from kafka.topic"))]
pub struct KafkaSpec {
    /// Bootstrap servers, `host:port`.
    #[schemars(length(min = 1, max = 16))]
    pub brokers: Vec<String>,
    /// Topic of order events.
    #[serde(default = "default_topic")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,249}$"))]
    pub topic: String,
    /// Dead-letter topic for events that cannot be stored.
    #[serde(default = "default_dlq_topic")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,249}$"))]
    pub dlq_topic: String,
}

fn default_topic() -> String {
    "flashsale.orders".to_owned()
}

fn default_dlq_topic() -> String {
    "flashsale.orders.dlq".to_owned()
}

/// The order database.
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    /// Database family.
    pub driver: DatabaseDriver,
    /// A Secret key holding the connection URL.
    pub url_secret_ref: SecretKeyRef,
    /// Events written per transaction.
    #[serde(default = "default_batch_size")]
    #[schemars(range(min = 1, max = 10000))]
    pub batch_size: i32,
    /// Longest wait before a partial batch is written.
    #[serde(default = "default_flush_interval")]
    #[x_kube(validation = duration::positive().message("database.flushInterval must be positive"))]
    pub flush_interval: Duration,
}

fn default_batch_size() -> i32 {
    200
}

fn default_flush_interval() -> Duration {
    Duration::from_millis(100)
}

/// Supported database families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DatabaseDriver {
    /// PostgreSQL.
    Postgres,
    /// MySQL protocol: MySQL, MariaDB, TiDB.
    Mysql,
}

/// Where a sale is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SalePhase {
    /// Before warm-up.
    Pending,
    /// Scaled to live size, inventory loaded, not yet open.
    WarmingUp,
    /// Open.
    Live,
    /// Closed; the order-writer drains what is left.
    Ended,
    /// Cannot proceed; the conditions say why.
    Failed,
}

/// Observed state of a FlashSale.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashSaleStatus {
    /// Where the sale is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SalePhase>,
    /// When the next phase change is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_transition_time: Option<Time>,
    /// observedGeneration and conditions.
    #[serde(flatten)]
    pub observed: ObservedConditions,
    /// Ready and desired replicas per workload.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub workloads: BTreeMap<String, WorkloadStatus>,
    /// "ready/total" workloads, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_workloads: Option<String>,
    /// Stock per SKU as the inventory reports it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<ItemStatus>,
    /// Units still available over all SKUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock_left: Option<i64>,
    /// When the operator first read the sale's stock from the inventory.
    /// From then on no inventory creates stock for the sale: a Redis that
    /// lost it is reported as lost stock, never refilled and sold again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock_loaded_at: Option<Time>,
}

/// Replicas of one workload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    /// Ready replicas.
    pub ready: i32,
    /// Desired replicas.
    pub desired: i32,
}

/// Stock of one SKU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ItemStatus {
    /// The SKU.
    pub sku: String,
    /// Units that can still be reserved.
    pub available: i64,
    /// Units reserved and not yet paid.
    pub reserved: i64,
    /// Units paid.
    pub sold: i64,
}
