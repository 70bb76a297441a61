//! The reasons the operator writes into a condition, an Event or a run
//! record: one enum per kind, so a reason is a word this API defines (and
//! alerting can rely on), never a string a controller makes up. Reasons more
//! than one kind gives (a lost load signal, a pod that will not start, a
//! failed reconcile) are enums of their own, nested in each kind's.

use std::fmt;

use crate::{chaosdrill::RunOutcome, flashsale::SalePhase};

/// A reason: a stable CamelCase word.
pub trait Reason: Copy + fmt::Debug + Send + Sync + 'static {
    /// The word as written in a condition, an Event or a run record.
    fn as_str(self) -> &'static str;
}

/// Declares a reason enum: unit variants are written as their own name;
/// nested variants (`Name(Inner)`), listed after a `;`, as the inner reason.
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident, )*
            $( ; $( $(#[$nmeta:meta])* $nested:ident($inner:ty), )* )?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            $( $( $(#[$nmeta])* $nested($inner), )* )?
        }

        impl $name {
            /// The reason as written.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => stringify!($variant), )*
                    $( $( Self::$nested(inner) => inner.as_str(), )* )?
                }
            }

            /// Every reason of this enum, nested ones included.
            pub fn all() -> Vec<Self> {
                #[allow(unused_mut)]
                let mut all = vec![$( Self::$variant, )*];
                $( $( all.extend(<$inner>::all().into_iter().map(Self::$nested)); )* )?
                all
            }
        }

        impl Reason for $name {
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }

        // A condition's or a record's reason is a string: compare it with
        // the enum directly.
        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                self == other.as_str()
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.as_str()
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        $( $(
            impl From<$inner> for $name {
                fn from(inner: $inner) -> Self {
                    Self::$nested(inner)
                }
            }
        )* )?
    };
}

reasons! {
    /// Why a load signal read from Prometheus has no usable value: a
    /// DegradationPolicy's `SignalAvailable` and a ChaosDrill guard's
    /// blindness.
    pub enum SignalLoss {
        /// Prometheus did not answer, or answered with an error status.
        PrometheusUnreachable,
        /// Prometheus refused the query (syntax, evaluation), or it returns
        /// a range vector: asking again will not help until it changes.
        InvalidQuery,
        /// The query returned no sample.
        EmptyResult,
        /// The query returned NaN or an infinity.
        NotANumber,
        /// The newest sample is older than the signal's `staleAfter`.
        StaleSample,
        /// The query returned more than one sample, so none is the value.
        AmbiguousResult,
    }
}

reasons! {
    /// Why a pod will not start by itself, in Kubernetes' own words (the
    /// scheduler's, or a container waiting reason of the kubelet's); a
    /// FlashSale's conditions quote it.
    pub enum PodFailure {
        /// The scheduler cannot place the pod (`PodScheduled` is `False`).
        Unschedulable,
        /// The image cannot be pulled; the kubelet backs off.
        ImagePullBackOff,
        /// Pulling the image failed.
        ErrImagePull,
        /// The image is absent and the pull policy is `Never`.
        ErrImageNeverPull,
        /// The image name does not parse.
        InvalidImageName,
        /// The container keeps exiting.
        CrashLoopBackOff,
        /// The container's configuration (a ConfigMap or Secret) is missing.
        CreateContainerConfigError,
        /// The runtime could not create the container.
        CreateContainerError,
        /// The runtime could not start the container.
        RunContainerError,
        /// The container's `postStart` hook failed.
        PreStartHookError,
    }
}

reasons! {
    /// Why a reconcile failed: the Warning Event's reason and the failure
    /// metric's label, for every kind.
    pub enum ErrorReason {
        /// This replica stopped leading; it does not write.
        NotLeader,
        /// A server-side apply failed.
        ApplyFailed,
        /// A create failed.
        CreateFailed,
        /// A delete failed.
        DeleteFailed,
        /// A get or a list failed.
        ReadFailed,
        /// A status write failed.
        StatusUpdateFailed,
        /// An object the operator would write exists and is not its own.
        ObjectNotOwned,
        /// An object lacks what the apiserver always sets, or does not
        /// decode as its kind; the message names the field.
        InvalidObject,
        /// An object could not be encoded for the apiserver.
        EncodeFailed,
        /// An object could not be built from the one reconciled.
        BuildFailed,
        /// A drill kill switch is on.
        KillSwitch,
        /// The run this work belonged to was stopped.
        RunStopped,
    }
}

reasons! {
    /// The reasons of a FlashSale's conditions and Events.
    pub enum SaleReason {
        /// The spec passed the operator's own checks (those CEL cannot
        /// express).
        SpecValid,
        /// The spec failed the operator's own checks; the message names the
        /// field.
        InvalidSpec,
        /// Nothing stands in the way.
        AsExpected,
        /// A Secret the spec names does not exist; the message names it.
        SecretMissing,
        /// A Secret exists but lacks the key the spec names.
        SecretKeyMissing,
        /// A Secret the operator makes for the sale (`<sale>-internal`)
        /// exists but belongs to something else; the message says how to
        /// clear it.
        SecretNotOwned,
        /// An object the operator would make for the sale exists already and
        /// is not the sale's: the operator does not take it over.
        ObjectNotOwned,
        /// A workload image of the spec is outside the operator's allowlist
        /// (`--allowed-image`); the message names each field.
        ImageNotAllowed,
        /// Every workload has all its desired replicas ready.
        WorkloadsReady,
        /// Some workload has fewer ready replicas than desired.
        WorkloadsNotReady,
        /// Some workload is still rolling out its current spec.
        RollingOut,
        /// Every workload runs its current spec.
        UpToDate,
        /// The inventory answered.
        StockRead,
        /// The inventory did not answer in time; the message says what
        /// failed.
        InventoryUnreachable,
        /// The workloads are scaled to zero, so there is nobody to ask.
        ScaledDown,
        /// Reservations may still be paid, or the order-writer still has lag.
        Draining,
        /// Nothing is left to persist.
        OrdersDrained,
        /// Event: the sale went back to `Pending`.
        PhasePending,
        /// Event: the sale is warming up.
        PhaseWarmingUp,
        /// Event: the sale opened.
        PhaseLive,
        /// Event: the sale closed.
        PhaseEnded,
        /// Event: the sale cannot proceed.
        PhaseFailed,
        ;
        /// A pod of the sale will not start; the kubelet's reason.
        Pod(PodFailure),
    }
}

impl SaleReason {
    /// The Event reason of a change to `phase`: one reason per phase, since
    /// Events of one reason on one object fold into a series.
    pub const fn phase(phase: SalePhase) -> Self {
        match phase {
            SalePhase::Pending => Self::PhasePending,
            SalePhase::WarmingUp => Self::PhaseWarmingUp,
            SalePhase::Live => Self::PhaseLive,
            SalePhase::Ended => Self::PhaseEnded,
            SalePhase::Failed => Self::PhaseFailed,
        }
    }
}

impl DrillReason {
    /// The Event reason of a run's end with `outcome`.
    pub const fn run_ended(outcome: RunOutcome) -> Self {
        match outcome {
            RunOutcome::Succeeded => Self::RunSucceeded,
            RunOutcome::Aborted => Self::RunAborted,
            RunOutcome::Skipped => Self::RunSkipped,
            RunOutcome::Failed => Self::RunFailed,
        }
    }
}

reasons! {
    /// The reasons of a DegradationPolicy's conditions and Events.
    pub enum PolicyReason {
        /// The spec passed the operator's own checks.
        SpecValid,
        /// The spec failed the operator's own checks; the message names the
        /// field.
        InvalidSpec,
        /// Nothing stands in the way.
        AsExpected,
        /// The FlashSale the policy names does not exist.
        SaleNotFound,
        /// Another DegradationPolicy already drives the same sale; the
        /// message names it.
        ConflictingPolicy,
        /// The switches ConfigMap exists and is not the policy's.
        ObjectNotOwned,
        /// Event: the tier in force changed; the note says from which, to
        /// which and why.
        TierChanged,
        /// Event: an override took effect (or changed); the note names who
        /// set it, the tier, until when and why.
        OverrideStarted,
        /// Event: an override expired or was removed; the signal decides
        /// again.
        OverrideEnded,
        /// `spec.override` expires too far ahead and is not applied.
        OverrideRefused,
        /// An override lapsed and no policy took the switches back: the
        /// operator lifted them.
        OverrideExpired,
        /// The load signal was read and is fresh.
        SignalOk,
        /// Every ready gateway applies the current switches.
        Applied,
        /// Some ready gateway does not apply the current switches yet.
        NotApplied,
        /// The sale has no ready gateway to apply the switches.
        NoGateways,
        ;
        /// The load signal is lost.
        Signal(SignalLoss),
    }
}

reasons! {
    /// The reasons of a ChaosDrill's conditions, Events, run records and
    /// guard verdicts.
    pub enum DrillReason {
        /// The spec passed the operator's own checks.
        SpecValid,
        /// The spec failed the operator's own checks; the message names the
        /// field.
        InvalidSpec,
        /// The FlashSale the drill names does not exist.
        SaleNotFound,
        /// A kill switch (the operator's flag or the namespace annotation)
        /// is on: nothing runs.
        KillSwitch,
        /// No tick of the schedule falls in an allowed window.
        NoAllowedRun,
        /// Waiting for the next run.
        Scheduled,
        /// A run is in progress.
        Running,
        /// `spec.suspend` is set.
        Suspended,
        /// Event: a run started.
        RunStarted,
        /// Event: a run ended with every experiment run and the SLO held.
        RunSucceeded,
        /// Event: the guard aborted a run.
        RunAborted,
        /// Event: a run was skipped.
        RunSkipped,
        /// Event: the operator could not run the drill.
        RunFailed,
        /// A run ended; its guard no longer reports.
        Ended,
        /// A run-now request came while a run is in progress.
        RunInProgress,
        /// Someone asked to abort the run (`flashsale.dev/abort-run`).
        AbortRequested,
        /// Event: `force` was asked where it cannot apply.
        ForceIgnored,
        /// The run's tick passed by more than the starting deadline.
        MissedSchedule,
        /// The sale is live and the drill avoids live sales.
        SaleLive,
        /// The sale went live during the run.
        SaleWentLive,
        /// Now is outside every allowed window.
        OutsideWindow,
        /// The window the run started in closed.
        WindowClosed,
        /// Now is inside a blackout.
        InBlackout,
        /// A blackout began during the run.
        BlackoutStarted,
        /// The calendar allows a run now.
        Allowed,
        /// The namespace has too few live pods for even one under the
        /// blast-radius cap.
        FleetTooSmall,
        /// Drills already hold the namespace's blast-radius budget.
        BudgetExhausted,
        /// Targets were chosen within the cap.
        Chosen,
        /// The SLO did not hold before injection, so nothing was injected.
        SteadyStateNotReached,
        /// Every objective holds.
        Healthy,
        /// An objective is breached but not yet for its `for`.
        Waiting,
        /// An objective was breached for its `for`: the guard aborts.
        SloBreached,
        /// The drill has no guard to report.
        NoGuard,
        /// The SLO held through the run and after.
        SloHeld,
        /// The SLO did not recover after the experiments were removed.
        SloNotRecovered,
        /// Chaos Mesh did not take up an experiment in time.
        ChaosMeshNotResponding,
        /// Chaos Mesh did not inject an experiment into its targets in time
        /// (a fault the node cannot run, no chaos-daemon on it); the message
        /// quotes Chaos Mesh.
        NotInjected,
        /// Reading from the apiserver failed.
        ReadFailed,
        /// Creating an experiment failed.
        CreateFailed,
        /// An experiment could not be built into an object.
        InvalidObject,
        /// Stopping the experiments failed.
        StopFailed,
        /// Chaos Mesh's own duration ended the experiments before the
        /// operator did.
        BackstopFired,
        /// Experiments were still present after the stop's bound.
        ExperimentsNotRemoved,
        /// No replica guards the run any longer (a restart or a lost lease);
        /// it was stopped.
        GuardLost,
        /// This replica stopped leading.
        NotLeader,
        /// The drill was deleted during a run.
        DrillDeleted,
        /// Every readiness check of the standby passed.
        StandbyReady,
        /// The standby's FlashSale does not exist (or its cluster cannot be
        /// reached).
        StandbyMissing,
        /// The standby's FlashSale is not Ready.
        StandbyNotReady,
        /// The standby's FlashSale is another sale (another sale id) than
        /// the primary, so it would not sell the replicated stock.
        StandbyOtherSale,
        /// The standby's ready gateways cannot carry both regions' load
        /// with the headroom asked.
        CapacityShort,
        /// A replication feeding the standby was behind its bound for
        /// longer than `lagGrace`.
        ReplicationLagging,
        /// The global endpoint does not see the standby healthy.
        EndpointStandbyDown,
        /// The global endpoint's answers come from another region while
        /// the primary sale is Ready: a false failover.
        FalseFailover,
        /// A readiness check could not be read (Prometheus, Redis or the
        /// endpoint did not answer usably); not ready until it can.
        ReadinessUnknown,
        /// An active failover run: the standby took buyers over and the
        /// primary took them back.
        FailedOver,
        /// An active failover run: buyers went without a serving region
        /// for longer than `maxRTO`; the faults were removed.
        RtoExceeded,
        /// An active failover run: the experiments ended before the
        /// standby took buyers over.
        NoFailover,
        /// An active failover run: every answer through the endpoint came
        /// from the primary region, so its experiments did not make it
        /// unavailable.
        NoOutage,
        /// An active failover run: the primary region did not take buyers
        /// back after the faults were removed.
        PrimaryNotRestored,
        /// An active failover run needs the primary sale's `spec.region`
        /// (the region its gateways stamp on their answers).
        RegionUnnamed,
        /// An active failover run: another region served buyers' pages but
        /// did not take their orders.
        OrdersNotTaken,
        /// An active failover run's buyer cannot sign its orders: the
        /// primary sale's drill key could not be read.
        DrillKeyUnreadable,
        /// An active failover run could not promote the standby region's
        /// Redis once buyers lost the primary; the faults were removed.
        PromotionFailed,
        /// An active failover run: more orders the primary region
        /// acknowledged were missing from the standby's database, once
        /// replication drained, than `maxRPO` allows.
        RpoExceeded,
        /// An active failover run: an order a region acknowledged is in
        /// neither region's database.
        OrdersLost,
        /// An active failover run could not read a region's order database
        /// to look its orders up.
        OrdersUnreadable,
        /// An active failover run could not hand a promoted standby Redis
        /// back to the primary: the standby stays primary, the primary's
        /// Redis follows it (if it could be fenced), and on-call finishes
        /// the switchback.
        SwitchbackFailed,
        /// An active failover run: after the switchback, the primary's
        /// Redis does not hold the reservation of an order a region
        /// acknowledged, so its stock would sell that unit again.
        StockInconsistent,
        ;
        /// The guard is blind: its signal is lost.
        Signal(SignalLoss),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Every reason a kind can write, as a string.
    fn words() -> Vec<Vec<&'static str>> {
        vec![
            SaleReason::all()
                .into_iter()
                .map(SaleReason::as_str)
                .collect(),
            PolicyReason::all()
                .into_iter()
                .map(PolicyReason::as_str)
                .collect(),
            DrillReason::all()
                .into_iter()
                .map(DrillReason::as_str)
                .collect(),
            ErrorReason::all()
                .into_iter()
                .map(ErrorReason::as_str)
                .collect(),
        ]
    }

    #[test]
    fn reasons_are_camel_case_words_unique_within_a_kind() {
        for kind in words() {
            let unique: HashSet<_> = kind.iter().collect();
            assert_eq!(unique.len(), kind.len(), "{kind:?}");
            for word in kind {
                assert!(word.starts_with(|c: char| c.is_ascii_uppercase()), "{word}");
                assert!(word.chars().all(|c| c.is_ascii_alphanumeric()), "{word}");
                // A condition's reason is at most 1024 characters.
                assert!(word.len() <= 64, "{word}");
            }
        }
    }

    #[test]
    fn nested_reasons_are_written_as_their_inner_word() {
        let lost = PolicyReason::from(SignalLoss::StaleSample);
        assert_eq!(lost.as_str(), "StaleSample");
        assert_eq!(
            DrillReason::from(SignalLoss::EmptyResult).to_string(),
            "EmptyResult"
        );
        assert_eq!(
            SaleReason::from(PodFailure::CrashLoopBackOff).as_str(),
            "CrashLoopBackOff"
        );
        assert_eq!(
            SaleReason::phase(SalePhase::WarmingUp).as_str(),
            "PhaseWarmingUp"
        );
        assert!(DrillReason::all().contains(&DrillReason::Signal(SignalLoss::AmbiguousResult)));
        for outcome in RunOutcome::ALL {
            let event = DrillReason::run_ended(outcome).as_str();
            assert_eq!(event, format!("Run{}", outcome.name()));
        }
    }
}
