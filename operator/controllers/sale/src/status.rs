//! The status step: what the controller saw, turned into the FlashSale's
//! status. Pure, so every condition is unit-tested; conditions keep their
//! transition time while unchanged, so an unchanged status is not written.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::{api::apps::v1::Deployment, apimachinery::pkg::apis::meta::v1::Time};

use kube::ResourceExt;

use super::build;
use flashsale_api::{
    children::Component, common::ObservedConditions, conditions::DRAINED,
    conditions::INVENTORY_REACHABLE, conditions::PROGRESSING, conditions::READY,
    conditions::STALLED, flashsale::FlashSaleStatus, flashsale::ItemStatus, flashsale::SalePhase,
    flashsale::WorkloadStatus, reasons::SaleReason,
};
use flashsale_kit::Blocker;
use flashsale_observe::pods::PodProblem;

/// What the status shows of one workload's Deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadView {
    /// Component label (gateway, inventory, order-writer).
    pub component: &'static str,
    /// Replicas wanted (the Deployment's, so an HPA's choice counts).
    pub desired: i32,
    /// Replicas ready.
    pub ready: i32,
    /// Whether the Deployment runs its current template everywhere.
    pub rolled_out: bool,
}

impl WorkloadView {
    /// Reads a Deployment of the operator's, by its component label.
    pub fn of_labelled(deployment: &Deployment) -> Option<Self> {
        let label = deployment.labels().get(build::COMPONENT_KEY)?;
        let component = Component::ALL.into_iter().find(|c| c.label() == label)?;
        Some(Self::of(component.label(), deployment))
    }

    /// Reads a Deployment as the apiserver holds it.
    pub fn of(component: &'static str, deployment: &Deployment) -> Self {
        let desired = deployment.spec.replicas.unwrap_or(1);
        let status = deployment.status.clone().unwrap_or_default();
        let ready = status.ready_replicas.unwrap_or(0);
        let observed =
            status.observed_generation.unwrap_or(0) >= deployment.metadata.generation.unwrap_or(0);
        let rolled_out = observed
            && status.updated_replicas.unwrap_or(0) >= desired
            && status.replicas.unwrap_or(0) == desired
            && ready >= desired;
        Self {
            component,
            desired,
            ready,
            rolled_out,
        }
    }
}

/// What the order-writer's drain looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    /// The sale has not ended.
    NotEnded,
    /// Ended; reservations can still be paid until the given time.
    Settling(Timestamp),
    /// Settled; every ready replica measured, the largest lag is this.
    Lag(i64),
    /// Settled; the lag is not known for every ready replica (the message
    /// names each one and why), so the order-writer keeps running.
    Unknown(String),
    /// Nothing left to write (sticky).
    Drained,
}

/// Everything one reconcile saw, for a sale that is not blocked.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The scheduled phase.
    pub phase: SalePhase,
    /// When it changes next.
    pub next_transition: Option<Timestamp>,
    /// The three Deployments.
    pub workloads: Vec<WorkloadView>,
    /// Stock per SKU, or why it could not be read; `None` when nobody runs.
    pub stock: Option<Result<Vec<ItemStatus>, String>>,
    /// The order-writer's drain.
    pub drain: Drain,
    /// Why pods of workloads that are short or rolling out do not run
    /// (looked for only then).
    pub pod_problems: Vec<PodProblem>,
}

fn start(old: Option<&FlashSaleStatus>, generation: Option<i64>) -> FlashSaleStatus {
    let mut status = old.cloned().unwrap_or_default();
    status.observed.observed_generation = generation;
    status
}

/// The status of a sale that cannot proceed: phase `Failed`, `Stalled` with
/// the blocker's reason, `Ready` false; what was last seen of the workloads
/// and stock stays, since nothing new was read.
pub fn blocked(
    old: Option<&FlashSaleStatus>,
    generation: Option<i64>,
    blocker: &Blocker<SaleReason>,
    now: Timestamp,
) -> FlashSaleStatus {
    let now = Time(now);
    let mut status = start(old, generation);
    status.phase = Some(SalePhase::Failed);
    status.next_transition_time = None;
    let conditions = &mut status.observed;
    conditions.set(STALLED, true, blocker.reason, &blocker.message, &now);
    conditions.set(READY, false, blocker.reason, &blocker.message, &now);
    conditions.set(
        PROGRESSING,
        false,
        blocker.reason,
        "waiting for the problem to be fixed",
        &now,
    );
    status
}

/// The first failing pod, and how many more there are.
fn pod_summary(seen: &Observation) -> String {
    let mut message = seen
        .pod_problems
        .first()
        .map(ToString::to_string)
        .unwrap_or_default();
    let more = seen.pod_problems.len().saturating_sub(1);
    if more > 0 {
        message.push_str(&format!(" (and {more} more pods failing)"));
    }
    message
}

/// The status of a sale the controller could reconcile.
pub fn observed(
    old: Option<&FlashSaleStatus>,
    generation: Option<i64>,
    seen: &Observation,
    now: Timestamp,
) -> FlashSaleStatus {
    let now = Time(now);
    let mut status = start(old, generation);
    status.phase = Some(seen.phase);
    status.next_transition_time = seen.next_transition.map(Time);
    status.workloads = seen
        .workloads
        .iter()
        .map(|w| {
            let replicas = WorkloadStatus {
                ready: w.ready,
                desired: w.desired,
            };
            (w.component.to_owned(), replicas)
        })
        .collect::<BTreeMap<_, _>>();
    let ready_count = seen
        .workloads
        .iter()
        .filter(|w| w.ready >= w.desired)
        .count();
    status.ready_workloads = Some(format!("{ready_count}/{}", seen.workloads.len()));

    workload_conditions(&mut status.observed, seen, &now);
    read_stock(&mut status, &seen.stock, &now);
    drain_condition(&mut status.observed, &seen.drain, &now);
    status
}

/// `Stalled`, `Ready` and `Progressing` from the workloads and their pods.
fn workload_conditions(conditions: &mut ObservedConditions, seen: &Observation, now: &Time) {
    // A pod that cannot run waits for someone to fix its image, its
    // configuration or the cluster: stalled, whether or not older pods
    // still serve.
    match seen.pod_problems.first() {
        Some(first) => conditions.set(
            STALLED,
            true,
            SaleReason::Pod(first.reason),
            pod_summary(seen),
            now,
        ),
        None => conditions.set(
            STALLED,
            false,
            SaleReason::AsExpected,
            "nothing stands in the way",
            now,
        ),
    }
    let lagging: Vec<String> = seen
        .workloads
        .iter()
        .filter(|w| w.ready < w.desired)
        .map(|w| format!("{} {}/{} ready", w.component, w.ready, w.desired))
        .collect();
    if lagging.is_empty() {
        conditions.set(
            READY,
            true,
            SaleReason::WorkloadsReady,
            "every workload has its desired replicas ready",
            now,
        );
    } else if let Some(first) = seen.pod_problems.first() {
        // The pods' own reason says more than a count.
        let message = format!("{}; {}", lagging.join(", "), pod_summary(seen));
        conditions.set(READY, false, SaleReason::Pod(first.reason), message, now);
    } else {
        conditions.set(
            READY,
            false,
            SaleReason::WorkloadsNotReady,
            lagging.join(", "),
            now,
        );
    }
    let rolling: Vec<&str> = seen
        .workloads
        .iter()
        .filter(|w| !w.rolled_out)
        .map(|w| w.component)
        .collect();
    if rolling.is_empty() {
        conditions.set(
            PROGRESSING,
            false,
            SaleReason::UpToDate,
            "every workload runs its current spec",
            now,
        );
    } else {
        conditions.set(
            PROGRESSING,
            true,
            SaleReason::RollingOut,
            format!("rolling out: {}", rolling.join(", ")),
            now,
        );
    }
}

/// The stock the inventory gave, and `InventoryReachable`.
fn read_stock(
    status: &mut FlashSaleStatus,
    stock: &Option<Result<Vec<ItemStatus>, String>>,
    now: &Time,
) {
    match stock {
        Some(Ok(items)) => {
            status.stock_left = Some(items.iter().map(|i| i.available).sum());
            status.items = items.clone();
            // Sticky: the first reading proves the stock was created.
            if !items.is_empty() && status.stock_loaded_at.is_none() {
                status.stock_loaded_at = Some(now.clone());
            }
            status.observed.set(
                INVENTORY_REACHABLE,
                true,
                SaleReason::StockRead,
                "stock read from the inventory",
                now,
            );
        }
        // The last reading stays: stale stock beats none, and the condition
        // says it is stale.
        Some(Err(err)) => status.observed.set(
            INVENTORY_REACHABLE,
            false,
            SaleReason::InventoryUnreachable,
            err,
            now,
        ),
        None => status.observed.set_unknown(
            INVENTORY_REACHABLE,
            SaleReason::ScaledDown,
            "the inventory is scaled to zero",
            now,
        ),
    }
}

/// `Drained`, once the sale ended.
fn drain_condition(conditions: &mut ObservedConditions, drain: &Drain, now: &Time) {
    match drain {
        Drain::NotEnded => conditions.conditions.retain(|c| c.type_ != DRAINED),
        Drain::Settling(until) => conditions.set(
            DRAINED,
            false,
            SaleReason::Draining,
            format!("reservations may still be paid until {until}"),
            now,
        ),
        Drain::Lag(lag) => conditions.set(
            DRAINED,
            false,
            SaleReason::Draining,
            format!("the order-writer still has {lag} events to write"),
            now,
        ),
        Drain::Unknown(why) => conditions.set(
            DRAINED,
            false,
            SaleReason::Draining,
            format!("the order-writer's lag is not known, so it keeps running: {why}"),
            now,
        ),
        Drain::Drained => conditions.set(
            DRAINED,
            true,
            SaleReason::OrdersDrained,
            "every reservation is settled and every order written; workloads scaled to zero",
            now,
        ),
    }
}

#[cfg(test)]
mod tests {
    use flashsale_api::reasons::PodFailure;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn view(component: &'static str, ready: i32, desired: i32) -> WorkloadView {
        WorkloadView {
            component,
            desired,
            ready,
            rolled_out: ready >= desired,
        }
    }

    fn seen(workloads: Vec<WorkloadView>) -> Observation {
        Observation {
            phase: SalePhase::Live,
            next_transition: Some(at(500)),
            workloads,
            stock: Some(Ok(vec![
                ItemStatus {
                    sku: "A".into(),
                    available: 7,
                    reserved: 2,
                    sold: 1,
                },
                ItemStatus {
                    sku: "B".into(),
                    available: 5,
                    reserved: 0,
                    sold: 0,
                },
            ])),
            drain: Drain::NotEnded,
            pod_problems: Vec::new(),
        }
    }

    fn condition<'a>(status: &'a FlashSaleStatus, type_: &str) -> (&'a str, &'a str) {
        status
            .observed
            .get(type_)
            .map(|c| (c.status.as_str(), c.reason.as_str()))
            .unwrap_or(("absent", ""))
    }

    #[test]
    fn all_ready_means_ready_with_stock_summed() {
        let all = vec![
            view("gateway", 2, 2),
            view("inventory", 2, 2),
            view("order-writer", 1, 1),
        ];
        let status = observed(None, Some(3), &seen(all), at(100));
        assert_eq!(status.phase, Some(SalePhase::Live));
        assert_eq!(condition(&status, READY), ("True", "WorkloadsReady"));
        assert_eq!(condition(&status, PROGRESSING), ("False", "UpToDate"));
        assert_eq!(condition(&status, STALLED), ("False", "AsExpected"));
        assert_eq!(
            condition(&status, INVENTORY_REACHABLE),
            ("True", "StockRead")
        );
        assert_eq!(condition(&status, DRAINED), ("absent", ""));
        assert_eq!(status.stock_left, Some(12));
        assert_eq!(status.ready_workloads.as_deref(), Some("3/3"));
        assert_eq!(status.observed.observed_generation, Some(3));
        assert_eq!(status.next_transition_time, Some(Time(at(500))));
    }

    #[test]
    fn a_short_workload_is_named_and_an_unchanged_status_compares_equal() {
        let some = vec![view("gateway", 1, 2), view("inventory", 2, 2)];
        let first = observed(None, Some(1), &seen(some.clone()), at(100));
        assert_eq!(condition(&first, READY), ("False", "WorkloadsNotReady"));
        assert_eq!(condition(&first, PROGRESSING), ("True", "RollingOut"));
        assert!(
            first
                .observed
                .get(READY)
                .is_some_and(|c| c.message == "gateway 1/2 ready"),
            "{:?}",
            first.observed.get(READY)
        );
        // Later, nothing changed: equal, so no write.
        let again = observed(Some(&first), Some(1), &seen(some), at(200));
        assert_eq!(again, first);
    }

    #[test]
    fn failing_pods_give_their_own_reason_to_ready() {
        let problem = |pod: &str, reason: PodFailure| PodProblem {
            component: "gateway".into(),
            pod: pod.into(),
            reason,
            message: "container gateway: Back-off pulling image \"nope:1\"".into(),
        };
        let mut short = seen(vec![view("gateway", 0, 2)]);
        short.pod_problems = vec![
            problem("s-gateway-a", PodFailure::ImagePullBackOff),
            problem("s-gateway-b", PodFailure::ImagePullBackOff),
        ];
        let status = observed(None, Some(1), &short, at(100));
        assert_eq!(condition(&status, READY), ("False", "ImagePullBackOff"));
        assert_eq!(condition(&status, STALLED), ("True", "ImagePullBackOff"));
        let message = status.observed.get(READY).map(|c| c.message.clone());
        assert_eq!(
            message.as_deref(),
            Some(
                "gateway 0/2 ready; gateway pod s-gateway-a: ImagePullBackOff: container gateway: \
                 Back-off pulling image \"nope:1\" (and 1 more pods failing)"
            )
        );
    }

    #[test]
    fn a_stuck_rollout_behind_ready_pods_is_stalled_but_still_ready() {
        let mut stuck = seen(vec![WorkloadView {
            component: "inventory",
            desired: 1,
            ready: 1,
            rolled_out: false,
        }]);
        stuck.pod_problems = vec![PodProblem {
            component: "inventory".into(),
            pod: "s-inventory-new".into(),
            reason: PodFailure::CrashLoopBackOff,
            message: "container inventory; last exit code 1 (Error), 4 restarts".into(),
        }];
        let status = observed(None, Some(1), &stuck, at(100));
        assert_eq!(condition(&status, READY), ("True", "WorkloadsReady"));
        assert_eq!(condition(&status, STALLED), ("True", "CrashLoopBackOff"));
        assert_eq!(condition(&status, PROGRESSING), ("True", "RollingOut"));
        // Fixed: the stall clears.
        stuck.pod_problems.clear();
        let fixed = observed(Some(&status), Some(2), &stuck, at(200));
        assert_eq!(condition(&fixed, STALLED), ("False", "AsExpected"));
    }

    #[test]
    fn an_unreachable_inventory_keeps_the_last_stock_and_says_so() {
        let all = vec![view("gateway", 1, 1)];
        let first = observed(None, Some(1), &seen(all.clone()), at(100));
        let mut cut = seen(all);
        cut.stock = Some(Err("connection refused".into()));
        let second = observed(Some(&first), Some(1), &cut, at(200));
        assert_eq!(
            condition(&second, INVENTORY_REACHABLE),
            ("False", "InventoryUnreachable")
        );
        assert_eq!(second.stock_left, Some(12));
        assert_eq!(condition(&second, READY), ("True", "WorkloadsReady"));
    }

    #[test]
    fn the_first_stock_reading_is_remembered_as_the_load_instant() {
        let all = vec![view("inventory", 1, 1)];
        let mut empty = seen(all.clone());
        empty.stock = Some(Ok(Vec::new()));
        let before = observed(None, Some(1), &empty, at(50));
        assert_eq!(before.stock_loaded_at, None, "no SKU read: nothing loaded");
        let first = observed(Some(&before), Some(1), &seen(all.clone()), at(100));
        assert_eq!(first.stock_loaded_at, Some(Time(at(100))));
        let mut cut = seen(all.clone());
        cut.stock = Some(Err("connection refused".into()));
        let unreachable = observed(Some(&first), Some(1), &cut, at(150));
        let later = observed(Some(&unreachable), Some(1), &seen(all), at(200));
        assert_eq!(later.stock_loaded_at, Some(Time(at(100))), "sticky");
    }

    #[test]
    fn a_blocker_fails_the_sale_and_clearing_it_recovers() {
        let blocker = Blocker {
            reason: SaleReason::SecretMissing,
            message: "Secret shop/jwt (spec.gateway.auth.hs256SecretRef) does not exist".into(),
        };
        let failed = blocked(None, Some(2), &blocker, at(100));
        assert_eq!(failed.phase, Some(SalePhase::Failed));
        assert_eq!(condition(&failed, STALLED), ("True", "SecretMissing"));
        assert_eq!(condition(&failed, READY), ("False", "SecretMissing"));
        assert!(
            failed
                .observed
                .get(STALLED)
                .is_some_and(|c| c.message.contains("shop/jwt"))
        );
        let fixed = observed(
            Some(&failed),
            Some(2),
            &seen(vec![view("gateway", 1, 1)]),
            at(200),
        );
        assert_eq!(fixed.phase, Some(SalePhase::Live));
        assert_eq!(condition(&fixed, STALLED), ("False", "AsExpected"));
        let since = fixed
            .observed
            .get(STALLED)
            .map(|c| c.last_transition_time.clone());
        assert_eq!(since, Some(Time(at(200))));
    }

    #[test]
    fn the_drain_is_reported_until_done() {
        let mut ended = seen(vec![view("order-writer", 1, 1)]);
        ended.phase = SalePhase::Ended;
        ended.drain = Drain::Lag(40);
        let status = observed(None, Some(1), &ended, at(100));
        assert_eq!(condition(&status, DRAINED), ("False", "Draining"));
        ended.drain = Drain::Drained;
        ended.stock = None;
        let status = observed(Some(&status), Some(1), &ended, at(200));
        assert_eq!(condition(&status, DRAINED), ("True", "OrdersDrained"));
        assert_eq!(
            condition(&status, INVENTORY_REACHABLE),
            ("Unknown", "ScaledDown")
        );
    }
}
