//! `ChaosDrill`: scheduled Chaos Mesh experiments against a sale, inside
//! allowed windows and a blast-radius cap, under an SLO guard that aborts
//! them, with an optional failover check.

// Each `printcolumn(...)` repeats the same keys, which this lint mistakes for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    common::{ObservedConditions, SaleRef, SecretKeyRef},
    duration::{self, Duration},
};

/// Annotation on a drill asking for a run now; its value names the
/// request, and each new value starts one run (still inside the windows).
pub const RUN_NOW_ANNOTATION: &str = "flashsale.dev/run-now";
/// Annotation on a drill that, together with a run-now request, lifts the
/// windows and blackouts for that run; its value says who and why.
pub const FORCE_ANNOTATION: &str = "flashsale.dev/force-reason";
/// Annotation on a drill asking to abort the run its value names: a run id,
/// so a request never ends a later run.
pub const ABORT_ANNOTATION: &str = "flashsale.dev/abort-run";
/// Annotation on a drill saying who asked for the abort and why, quoted in
/// the run's message.
pub const ABORT_REASON_ANNOTATION: &str = "flashsale.dev/abort-reason";
/// Annotation on a drill asking for a failover readiness check now; its
/// value names the request, and each new value makes one check
/// (`status.failover.request` names the last one answered).
pub const CHECK_ANNOTATION: &str = "flashsale.dev/check-readiness";
/// Annotation on a namespace that stops every run in it and removes every
/// experiment the operator created there, while it is `"true"`.
pub const KILL_SWITCH_ANNOTATION: &str = "flashsale.dev/chaos-kill-switch";

/// A recurring chaos drill against one FlashSale.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "flashsale.dev",
    version = "v1alpha1",
    kind = "ChaosDrill",
    plural = "chaosdrills",
    shortname = "drill",
    category = "flashsale",
    namespaced,
    derive = "PartialEq",
    status = "ChaosDrillStatus",
    doc = "Scheduled Chaos Mesh experiments against a FlashSale under an SLO guard.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Next Run", type_ = "date", json_path = ".status.nextRunTime"),
    printcolumn(
        name = "Last Outcome",
        type_ = "string",
        json_path = ".status.lastOutcome"
    ),
    printcolumn(
        name = "Abort Latency",
        type_ = "string",
        json_path = ".status.lastAbortLatency"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    // The name is the value of the `flashsale.dev/drill` label on every
    // Chaos Mesh object of a run, and label values are at most 63
    // characters: a longer name could never run.
    validation = Rule::new("size(self.metadata.name) <= 63")
        .message("metadata.name of a ChaosDrill must be at most 63 characters (it labels the drill's Chaos Mesh objects)")
        .reason(Reason::FieldValueInvalid)
)]
#[serde(rename_all = "camelCase")]
pub struct ChaosDrillSpec {
    /// The sale under test.
    pub sale_ref: SaleRef,
    /// When runs start.
    pub schedule: DrillSchedule,
    /// Local-time windows in which injection is allowed; none means always.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 14))]
    pub windows: Vec<Window>,
    /// Explicit periods with no injection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub blackouts: Vec<Blackout>,
    /// Never inject while the target sale is Live.
    #[serde(default = "default_true")]
    pub avoid_live_sale: bool,
    /// Stop scheduling new runs (a running one is not affected).
    #[serde(default)]
    pub suspend: bool,
    /// Experiments of one run, injected in order. Names are unique.
    #[schemars(length(min = 1, max = 10))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub experiments: Vec<Experiment>,
    /// Hard cap on the pods any experiment may touch.
    pub blast_radius: BlastRadius,
    /// The SLO guard (dead-man switch) that aborts a run.
    pub slo_guard: SloGuard,
    /// Check that the standby can take over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverCheck>,
    /// Finished runs kept in the status.
    #[serde(default = "default_history_limit")]
    #[schemars(range(min = 1, max = 50))]
    pub history_limit: i32,
}

fn default_true() -> bool {
    true
}

fn default_history_limit() -> i32 {
    10
}

/// A cron schedule in a named time zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillSchedule {
    /// Five-field cron expression (minute hour day-of-month month day-of-week).
    #[schemars(length(min = 9, max = 128))]
    pub cron: String,
    /// IANA time zone of `cron`, `windows` and the printed times, e.g. Asia/Tokyo.
    #[serde(default = "default_time_zone")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
}

fn default_time_zone() -> String {
    "UTC".to_owned()
}

/// Days of the week.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Weekday {
    /// Monday.
    Mon,
    /// Tuesday.
    Tue,
    /// Wednesday.
    Wed,
    /// Thursday.
    Thu,
    /// Friday.
    Fri,
    /// Saturday.
    Sat,
    /// Sunday.
    Sun,
}

/// Allowed days and a local time range (same day; windows do not cross midnight).
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.end > self.start").message("window end must be after window start (windows do not cross midnight)"))]
pub struct Window {
    /// Days the window opens on.
    #[schemars(length(min = 1, max = 7))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub days: Vec<Weekday>,
    /// Opening local time, `HH:MM`.
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,
    /// Closing local time, `HH:MM` (24:00 allowed).
    #[schemars(regex(pattern = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"))]
    pub end: String,
}

/// A period with no injection.
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.end > self.start").message("blackout end must be after its start"))]
pub struct Blackout {
    /// Start (RFC 3339).
    pub start: Time,
    /// End (RFC 3339).
    pub end: Time,
    /// Why, e.g. "payment provider maintenance".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub reason: Option<String>,
}

/// The workload of the sale an experiment targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TargetWorkload {
    /// The gateway pods.
    Gateway,
    /// The inventory pods.
    Inventory,
    /// The order-writer pods.
    OrderWriter,
}

/// One Chaos Mesh experiment: exactly one of `podChaos`, `networkChaos`,
/// `stressChaos`, `timeChaos`.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "[has(self.podChaos), has(self.networkChaos), has(self.stressChaos), has(self.timeChaos)].filter(x, x).size() == 1"
).message("an experiment needs exactly one of podChaos, networkChaos, stressChaos and timeChaos"))]
pub struct Experiment {
    /// Name, unique in the drill; part of the Chaos Mesh object's name.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$"))]
    pub name: String,
    /// The workload whose pods are targeted.
    pub target: TargetWorkload,
    /// How long the fault stays injected (Chaos Mesh recovers it after).
    #[x_kube(validation = duration::rule(
        &["self"],
        "duration(self) > duration('0s') && duration(self) <= duration('1h')",
    ).message("experiment duration must be positive and at most 1h"))]
    pub duration: Duration,
    /// Kill or fail pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_chaos: Option<PodChaosAction>,
    /// Delay, lose or partition traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_chaos: Option<NetworkChaosAction>,
    /// Burn CPU or memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stress_chaos: Option<StressChaosAction>,
    /// Skew the clock the target's processes read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_chaos: Option<TimeChaosAction>,
}

/// PodChaos parameters.
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.container) || self.action == 'container-kill'").message("podChaos.container is for container-kill only"))]
pub struct PodChaosAction {
    /// What happens to the pods.
    pub action: PodChaosKind,
    /// Container to kill with `container-kill`; the workload's own container
    /// (named like the workload: `gateway`, `inventory`, `order-writer`)
    /// when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub container: Option<String>,
}

/// Chaos Mesh PodChaos actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PodChaosKind {
    /// Delete pods (their controller recreates them).
    PodKill,
    /// Make pods unavailable for the duration.
    PodFailure,
    /// Kill one container.
    ContainerKill,
}

/// NetworkChaos parameters.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.action != 'delay' || has(self.latency)").message("networkChaos.latency is required for delay"))]
#[x_kube(validation = Rule::new("self.action != 'loss' || has(self.lossPercent)").message("networkChaos.lossPercent is required for loss"))]
pub struct NetworkChaosAction {
    /// What happens to traffic.
    pub action: NetworkChaosKind,
    /// Added latency for `delay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Duration>,
    /// Latency jitter for `delay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<Duration>,
    /// Percent of packets dropped for `loss`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub loss_percent: Option<f64>,
    /// How much a packet's delay or loss follows the previous packet's,
    /// percent (netem's correlation); 0 when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub correlation_percent: Option<f64>,
    /// Only traffic to this workload of the sale (with `toAddresses`, to
    /// either; all traffic when both are empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<TargetWorkload>,
    /// Only traffic to these addresses outside the sale's workloads, such
    /// as one of its stores by its Service's DNS name
    /// (`redis.shop.svc.cluster.local`), an IPv4 address or a CIDR, each
    /// with an optional `:port`. Chaos Mesh's controller resolves names
    /// when it injects, as the cluster's DNS answers it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 8),
        inner(length(min = 1, max = 253)),
        inner(regex(
            pattern = r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(/[0-9]{1,2})?(:[0-9]{1,5})?$"
        ))
    )]
    pub to_addresses: Vec<String>,
}

/// Chaos Mesh NetworkChaos actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkChaosKind {
    /// Add latency.
    Delay,
    /// Drop packets.
    Loss,
    /// Cut the targets off.
    Partition,
}

/// StressChaos parameters.
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.cpuWorkers) || has(self.memoryWorkers)").message("stressChaos needs cpuWorkers or memoryWorkers"))]
pub struct StressChaosAction {
    /// CPU stressors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub cpu_workers: Option<i32>,
    /// Load each CPU stressor applies, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub cpu_load_percent: Option<i32>,
    /// Memory stressors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub memory_workers: Option<i32>,
    /// Memory each stressor holds, e.g. 256MB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(KB|MB|GB|%)$"))]
    pub memory_size: Option<String>,
}

/// TimeChaos parameters: the wall clock (`CLOCK_REALTIME`) of the target
/// container's processes is moved by `offset`; their monotonic clocks are
/// left alone, as a drifting NTP would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeChaosAction {
    /// How far the clock moves, signed: `30s` ahead, `-2m` behind (Go's
    /// duration syntax, as Chaos Mesh reads it).
    #[schemars(regex(pattern = r"^-?([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"))]
    pub offset: String,
}

/// The most pods one experiment may touch: the smaller of the two bounds,
/// computed from the live target pods at injection time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlastRadius {
    /// Percent of the target workload's live pods, in (0, 100].
    #[schemars(range(min = 0.0, max = 100.0), extend("exclusiveMinimum" = true))]
    pub max_percent: f64,
    /// Absolute cap on pods.
    #[schemars(range(min = 1))]
    pub max_pods: i32,
}

/// The SLO guard: queries that must hold before and during injection.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = duration::rule(
    &["self.staleAfter", "self.interval"],
    "duration(self.staleAfter) >= duration(self.interval)",
).message("sloGuard.staleAfter must be at least sloGuard.interval").field_path(".staleAfter"))]
pub struct SloGuard {
    /// Prometheus base URL; the operator's `--prometheus-url` when unset.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "prometheusURL"
    )]
    #[schemars(regex(pattern = r"^https?://"), length(max = 512))]
    pub prometheus_url: Option<String>,
    /// Objectives; any breach aborts the run. Names are unique.
    #[schemars(length(min = 1, max = 10))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub objectives: Vec<SloObjective>,
    /// How often every objective is evaluated; at most 10s, since a breach
    /// is seen at most this late.
    #[serde(default = "default_guard_interval")]
    #[x_kube(validation = duration::rule(
        &["self"],
        "duration(self) > duration('0s') && duration(self) <= duration('10s')",
    ).message("sloGuard.interval must be positive and at most 10s"))]
    pub interval: Duration,
    /// Dead-man bound: with no fresh answer for this long the guard counts
    /// as blind and the run is aborted. At most 30s: it is how long chaos
    /// may run unwatched.
    #[serde(default = "default_stale_after")]
    #[x_kube(validation = duration::rule(
        &["self"],
        "duration(self) <= duration('30s')",
    ).message("sloGuard.staleAfter must be at most 30s (the time chaos may run unwatched)"))]
    pub stale_after: Duration,
    /// How long every objective must hold before injection starts.
    #[serde(default = "default_steady_state")]
    pub steady_state: Duration,
}

fn default_guard_interval() -> Duration {
    Duration::from_millis(250)
}

fn default_stale_after() -> Duration {
    Duration::from_secs(2)
}

fn default_steady_state() -> Duration {
    Duration::from_secs(60)
}

/// One SLO: a PromQL instant query and the threshold it must not cross.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SloObjective {
    /// Name, e.g. `error-rate` or `checkout-p99`.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"))]
    pub name: String,
    /// Instant query returning one sample; `$namespace` and `$sale` stand
    /// for the drill's namespace and its sale's name.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
    /// The breach threshold.
    pub threshold: f64,
    /// A breach is a value above (default) or below the threshold.
    #[serde(default)]
    pub breach_when: BreachWhen,
}

impl SloObjective {
    /// The query with `$namespace` and `$sale` replaced by the drill's
    /// namespace and its sale's name, so that one drill file serves every
    /// namespace it is applied in (the drills in `chaos/` rely on it).
    pub fn query_in(&self, namespace: &str, sale: &str) -> String {
        self.query
            .replace("$namespace", namespace)
            .replace("$sale", sale)
    }

    /// Whether `value` is on the safe side of the threshold, equality
    /// included. Written as the safe case so that a NaN is never safe.
    pub fn holds(&self, value: f64) -> bool {
        match self.breach_when {
            BreachWhen::Above => value <= self.threshold,
            BreachWhen::Below => value >= self.threshold,
        }
    }
}

/// Direction of a breach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum BreachWhen {
    /// Value > threshold breaches (error rates, latencies).
    #[default]
    Above,
    /// Value < threshold breaches (success rates, throughput).
    Below,
}

/// Checks that a standby can take the sale over: continuously while the
/// drill exists (readiness), and by moving traffic in an active run.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode != 'Active' || (has(self.endpoint) && has(self.endpoint.url))").message("failover.endpoint.url is required in mode Active: the run measures the failover through it"))]
pub struct FailoverCheck {
    /// Probe the standby only, or move traffic to it.
    pub mode: FailoverMode,
    /// Most time the standby may take to serve.
    #[x_kube(validation = duration::positive().message("failover.maxRTO must be positive"))]
    #[serde(rename = "maxRTO")]
    pub max_rto: Duration,
    /// Most orders the primary region acknowledged that the standby's
    /// database may lack once replication drained, in an active run that
    /// reads both databases (`orders`). 0: none may be lost.
    #[serde(rename = "maxRPO", default)]
    #[schemars(range(min = 0))]
    pub max_rpo: i64,
    /// The standby region's sale.
    pub standby: StandbySale,
    /// Whether the standby can carry both regions' load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityCheck>,
    /// How far each replication feeding the standby is behind. Names are
    /// unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub replication: Vec<ReplicationLag>,
    /// Whether the global endpoint sees the standby healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointCheck>,
    /// Both regions' order databases: an active run looks its buyer's
    /// acknowledged orders up in them by id, for the RPO and for orders
    /// lost in both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orders: Option<OrdersCheck>,
    /// How often readiness is checked while the drill exists.
    #[serde(default = "default_check_every")]
    #[x_kube(validation = duration::rule(
        &["self"],
        "duration(self) >= duration('1s') && duration(self) <= duration('10m')",
    ).message("failover.checkEvery must be between 1s and 10m"))]
    pub check_every: Duration,
    /// How long a replication lag may stay above its bound before the
    /// standby counts as not ready: a shorter spike is reported, not
    /// alarmed on. At most 10m, so a grace cannot switch the check off.
    #[serde(default = "default_lag_grace")]
    #[x_kube(validation = duration::rule(
        &["self"],
        "duration(self) <= duration('10m')",
    ).message("failover.lagGrace must be at most 10m"))]
    pub lag_grace: Duration,
}

fn default_check_every() -> Duration {
    Duration::from_secs(15)
}

fn default_lag_grace() -> Duration {
    Duration::from_secs(30)
}

/// Where the standby region's FlashSale is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandbySale {
    /// Namespace of the standby sale (in the standby's cluster).
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the standby sale.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// A kubeconfig for the standby's cluster, in a Secret of the drill's
    /// namespace; unset means this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<SecretKeyRef>,
    /// The standby's gateways as a buyer reaches them without the global
    /// endpoint: an active run's buyer orders there too, at the same pace,
    /// which shows when the standby took orders apart from when the
    /// endpoint sent buyers to it, and that it refused them before.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "gatewayURL"
    )]
    #[schemars(regex(pattern = r"^https?://"), length(max = 512))]
    pub gateway_url: Option<String>,
}

/// The capacity arithmetic: ready standby gateways × `perGatewayRPS` must
/// cover (primary load + standby load) × `headroom`.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.perGatewayRPS > 0.0").message("failover.capacity.perGatewayRPS must be positive"))]
#[x_kube(validation = Rule::new("self.headroom >= 1.0").message("failover.capacity.headroom must be at least 1"))]
pub struct CapacityCheck {
    /// Requests per second one ready standby gateway serves.
    #[serde(rename = "perGatewayRPS")]
    pub per_gateway_rps: f64,
    /// Margin over the summed load.
    #[serde(default = "default_headroom")]
    pub headroom: f64,
    /// PromQL giving a sale's load in requests per second; `$namespace` and
    /// `$sale` are replaced by each region's sale. Evaluated at the guard's
    /// Prometheus for both regions.
    #[schemars(length(min = 1, max = 4096))]
    pub load: String,
}

fn default_headroom() -> f64 {
    1.25
}

/// One replication feeding the standby, and how far behind it may be.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.query) != has(self.redisURLSecretRef)").message("each failover.replication entry needs exactly one of query and redisURLSecretRef"))]
#[x_kube(validation = Rule::new("!has(self.promoteRedisURLSecretRef) || has(self.redisURLSecretRef)").message("promoteRedisURLSecretRef names the replica of the Redis in redisURLSecretRef: set both"))]
pub struct ReplicationLag {
    /// Name, unique in the drill.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Most lag that still counts as ready (a Redis replica reads 0-1s
    /// while healthy: it acknowledges every second).
    #[x_kube(validation = duration::rule(
        &["self"],
        "duration(self) > duration('0s') && duration(self) <= duration('1h')",
    ).message("maxLag must be positive and at most 1h"))]
    pub max_lag: Duration,
    /// PromQL giving the lag in seconds, at the guard's Prometheus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub query: Option<String>,
    /// The URL of the primary region's Redis, in a Secret of the drill's
    /// namespace: the lag is its slowest replica's, read from
    /// `INFO replication`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "redisURLSecretRef"
    )]
    pub redis_url_secret_ref: Option<SecretKeyRef>,
    /// The URL of the standby region's Redis, that primary's replica, in a
    /// Secret of the drill's namespace: an active run promotes it
    /// (`REPLICAOF NO ONE`) once buyers lose the primary region, as a
    /// region failover's runbook would, so the standby's inventory sells,
    /// and has it follow the primary again once the primary took buyers
    /// back, or however else the run ends.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "promoteRedisURLSecretRef"
    )]
    pub promote_redis_url_secret_ref: Option<SecretKeyRef>,
}

/// Where an active run finds the orders its buyer placed: each region's
/// order database, as the order-writers write it (`postgres://` or
/// `mysql://`), each URL in a Secret of the drill's namespace.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrdersCheck {
    /// The primary region's order database.
    #[serde(rename = "primaryDatabaseURLSecretRef")]
    pub primary_database_url_secret_ref: SecretKeyRef,
    /// The standby region's order database, fed from the primary by
    /// replication (Kafka mirroring, change capture or a database replica).
    #[serde(rename = "standbyDatabaseURLSecretRef")]
    pub standby_database_url_secret_ref: SecretKeyRef,
    /// How long after the primary took buyers back the standby's database
    /// may take to hold the primary's orders (replication draining) before
    /// the ones it lacks count against `maxRPO`.
    #[serde(default = "default_drain_within")]
    #[x_kube(validation = duration::rule(
        &["self"],
        "duration(self) > duration('0s') && duration(self) <= duration('10m')",
    ).message("failover.orders.drainWithin must be positive and at most 10m"))]
    pub drain_within: Duration,
}

fn default_drain_within() -> Duration {
    Duration::from_secs(30)
}

/// How the global endpoint sees the standby.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.query) != has(self.haproxyStatsURL)").message("failover.endpoint needs exactly one of query and haproxyStatsURL"))]
#[x_kube(validation = Rule::new("!has(self.haproxyStatsURL) || has(self.server)").message("failover.endpoint.server is required with haproxyStatsURL"))]
pub struct EndpointCheck {
    /// PromQL that is 1 while the endpoint sees the standby healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub query: Option<String>,
    /// HAProxy's CSV statistics (`…/;csv`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "haproxyStatsURL"
    )]
    #[schemars(regex(pattern = r"^https?://"), length(max = 512))]
    pub haproxy_stats_url: Option<String>,
    /// The standby's server in those statistics, `backend/server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[^/]+/[^/]+$"), length(max = 256))]
    pub server: Option<String>,
    /// The global endpoint's base URL, as buyers reach it. When set, each
    /// check sends it one `GET /` and reads which region answered (the
    /// gateways stamp `flashsale-region` on every answer): another region
    /// answering while the primary sale is Ready is a false failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://"), length(max = 512))]
    pub url: Option<String>,
}

/// How far a failover check goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FailoverMode {
    /// Probe that the standby is ready; no traffic moves.
    ReadinessOnly,
    /// Run the experiments, which must make the primary region
    /// unavailable, while asking the global endpoint (`endpoint.url`) which
    /// region answers: the run measures the RTO and the failback, and is
    /// aborted once buyers have gone without a serving region for `maxRTO`.
    Active,
}

/// Where a drill is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DrillPhase {
    /// Waiting for the next allowed run.
    Scheduled,
    /// Waiting for the SLOs to hold for the steady-state period.
    SteadyState,
    /// Faults injected, guard watching.
    Injecting,
    /// Faults removed; waiting for the SLOs to hold again.
    Verifying,
    /// Removing faults after a breach or a blind guard.
    Aborting,
    /// `spec.suspend` is set, or the kill switch is on.
    Suspended,
    /// The spec cannot be run; the conditions say why.
    Failed,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RunOutcome {
    /// Every experiment ran its duration with the SLOs held.
    Succeeded,
    /// The guard saw a breach, or went blind, and the faults were removed.
    Aborted,
    /// Not started: outside a window, in a blackout, sale Live, SLO already breaking.
    Skipped,
    /// The operator could not run it (API errors, missing CRDs).
    Failed,
}

impl RunOutcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Self; 4] = [Self::Succeeded, Self::Aborted, Self::Skipped, Self::Failed];

    /// The outcome's name, as in the status, the Events and the metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Succeeded => "Succeeded",
            Self::Aborted => "Aborted",
            Self::Skipped => "Skipped",
            Self::Failed => "Failed",
        }
    }
}

/// Observed state of a ChaosDrill.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChaosDrillStatus {
    /// Where the drill is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DrillPhase>,
    /// When the next run may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_time: Option<Time>,
    /// The run in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_run: Option<RunRecord>,
    /// Finished runs, newest first, at most `historyLimit`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub history: Vec<RunRecord>,
    /// Outcome of the latest finished run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_outcome: Option<RunOutcome>,
    /// Abort latency of the latest aborted run, e.g. `180ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_abort_latency: Option<Duration>,
    /// The standby's readiness as last checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverStatus>,
    /// The last run-now request handled (the annotation's value), so one
    /// request starts one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub last_run_request: Option<String>,
    /// observedGeneration and conditions.
    #[serde(flatten)]
    pub observed: ObservedConditions,
}

/// The standby's readiness, with each check's numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverStatus {
    /// When readiness was last checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<Time>,
    /// Whether every check passed.
    pub ready: bool,
    /// Each check: standby, capacity, each replication, endpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub checks: Vec<ReadinessCheck>,
    /// The latest check request (`flashsale.dev/check-readiness`) this
    /// check answers, so one request makes one check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub request: Option<String>,
}

/// One readiness check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessCheck {
    /// `standby`, `capacity`, `endpoint`, or `replication/<name>`.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// What was measured, e.g. `1.8s` or `2400 rps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The bound it was held to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<String>,
    /// Since when a lag has been above its bound (a spike younger than
    /// `lagGrace` still passes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above_since: Option<Time>,
    /// The check in a sentence.
    #[schemars(length(max = 512))]
    pub message: String,
}

/// One run of a drill.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Run id, used in the Chaos Mesh objects' labels.
    pub id: String,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Time>,
    /// How it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<RunOutcome>,
    /// Why, as a CamelCase reason (`SloBreached`, `OutsideWindow`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reason in a sentence, with the numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub message: Option<String>,
    /// Pods targeted after the blast-radius cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targeted_pods: Option<i32>,
    /// The pods named in the experiments' selectors, `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub targets: Vec<String>,
    /// The Chaos Mesh objects of the run, `Kind/name`; the Workflow first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub objects: Vec<String>,
    /// The run-now request (`flashsale.dev/run-now`) that started this run,
    /// or that this skipped record refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub request: Option<String>,
    /// Who forced the run outside its windows, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub forced: Option<String>,
    /// When the experiments were created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected_at: Option<MicroTime>,
    /// When Prometheus evaluated the answer that made the guard abort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected_at: Option<MicroTime>,
    /// When the guard decided to abort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<MicroTime>,
    /// When Chaos Mesh reported every target recovered (or the object gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_at: Option<MicroTime>,
    /// When every Chaos Mesh object of the run was gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone_at: Option<MicroTime>,
    /// The answer's evaluation to the guard's decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detection_latency: Option<Duration>,
    /// The guard's decision to every experiment object being gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_latency: Option<Duration>,
    /// Worst value of each objective during the run.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub slo_extremes: std::collections::BTreeMap<String, f64>,
    /// An active failover run's RTO: from the first answer through the
    /// global endpoint that did not come from the primary region to the
    /// first of a sustained run of answers from another one.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "failoverRTO"
    )]
    pub failover_rto: Option<Duration>,
    /// An active failover run's RTO for orders: from the first order of
    /// its buyer the primary region did not acknowledge to the first of a
    /// sustained run another region acknowledged.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "orderRTO")]
    pub order_rto: Option<Duration>,
    /// An active failover run's RTO at the standby directly
    /// (`standby.gatewayURL`): from the first answer through the endpoint
    /// the primary did not serve to the first of a sustained run of orders
    /// the standby's gateways acknowledged when asked directly.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "directOrderRTO"
    )]
    pub direct_order_rto: Option<Duration>,
    /// The region that took buyers over in an active failover run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub failed_over_to: Option<String>,
    /// An active failover run's failback: from the faults' removal to the
    /// first of a sustained run of answers from the primary region again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failback: Option<Duration>,
    /// An active failover run's RPO, in orders: those its buyer had
    /// acknowledged by the primary region that the standby's database
    /// lacked once replication drained (`failover.orders`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "failoverRPO"
    )]
    pub failover_rpo: Option<i64>,
    /// An active failover run's stock divergence: units of the drill SKU
    /// the primary region had given out that the standby's promoted Redis
    /// did not know of, which it would sell again (summed over
    /// `promoted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversold_units: Option<i64>,
    /// An active failover run's consistency after the switchback: orders
    /// of the run acknowledged by either region whose reservation the
    /// primary's Redis does not hold, units its stock would give out a
    /// second time. 0 when both regions' sales are accounted for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreserved_orders: Option<i64>,
    /// What an active failover run's synthetic buyer got for its orders
    /// through the global endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill_orders: Option<DrillOrders>,
    /// What the same buyer got for the orders it placed at the standby's
    /// gateways directly (`standby.gatewayURL`), bypassing the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_orders: Option<DrillOrders>,
    /// The standby Redis servers an active failover run promoted, each
    /// recorded before its promotion, so whoever ends the run (this
    /// replica, or the next after a restart) has it follow its primary
    /// again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub promoted: Vec<Promotion>,
}

/// A standby Redis an active failover run promoted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Promotion {
    /// The `failover.replication` entry that names it.
    #[schemars(length(max = 63))]
    pub name: String,
    /// The primary it followed, `host:port` as it reached it (from its
    /// `INFO replication`), which it follows again after the run.
    #[schemars(length(max = 300))]
    pub follows: String,
    /// When it was promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<MicroTime>,
    /// When the primary's Redis was made to follow it (fenced), so the
    /// primary region sells nothing the standby sells and takes the
    /// standby's sales back with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_at: Option<MicroTime>,
    /// When it followed the primary again, once the primary had caught up
    /// with it and was primary again (the switchback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<MicroTime>,
    /// Units of the drill SKU the primary's inventory had given out
    /// (reserved or sold) when the standby was promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_held: Option<i64>,
    /// The same units as the standby held them once promoted: fewer than
    /// the primary's are units it would sell again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_held: Option<i64>,
    /// How far the standby was behind the primary's replication stream
    /// when promoted, in bytes: the primary's offset read right after the
    /// promotion less the standby's read right before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind_bytes: Option<i64>,
}

impl Promotion {
    /// Units the primary had given out that the promoted standby did not
    /// know of, once both were read.
    pub fn diverged(&self) -> Option<i64> {
        Some((self.primary_held? - self.standby_held?).max(0))
    }
}

/// An active failover run's drill orders (SKU `_drill`, one unit each),
/// placed through the global endpoint at a fixed pace from before the
/// faults until the primary served buyers again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillOrders {
    /// Orders placed.
    pub placed: i64,
    /// Orders a gateway acknowledged (201), per region it stamped.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub acknowledged: std::collections::BTreeMap<String, i64>,
    /// Orders a gateway answered otherwise, per region it stamped.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub refused: std::collections::BTreeMap<String, i64>,
    /// Orders no gateway answered: the endpoint's own error page, or
    /// nothing within the bound.
    #[serde(default)]
    pub unanswered: i64,
    /// Acknowledged orders (by any region) that neither region's database
    /// held once replication drained: lost (`failover.orders`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objective_query_names_the_drills_namespace_and_sale() {
        let objective = SloObjective {
            name: "gateways-up".to_owned(),
            query: r#"count(up{namespace="$namespace", pod=~"$sale-gateway-.*"} == 1)"#.to_owned(),
            threshold: 2.0,
            breach_when: BreachWhen::Below,
        };
        assert_eq!(
            objective.query_in("shop", "singles-day"),
            r#"count(up{namespace="shop", pod=~"singles-day-gateway-.*"} == 1)"#
        );
    }
}
