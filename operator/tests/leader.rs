//! Leader election against the real local kube-apiserver, with short
//! timings: one leader among candidates, handover after a crash within the
//! lease duration, immediate handover after a graceful shutdown, and an
//! immediate step-down when the lease is overwritten.

use std::time::Duration;

use flashsale_e2e::{
    kube::{TestNamespace, client},
    wait::poll_until,
};
use flashsale_kit::{leader, leader::LeaderError, leader::Leadership, leader::LeaseSettings};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::PostParams};
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

const LEASE: &str = "flashsale-operator";
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// Allowance for apiserver round trips and scheduling on a busy machine.
const SLACK: Duration = Duration::from_millis(1500);
/// How often the tests look at the leadership flags.
const POLL: Duration = Duration::from_millis(20);

/// One running candidate.
struct Candidate {
    identity: String,
    leadership: Leadership,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), LeaderError>>,
}

impl Candidate {
    /// Starts a candidate with its own client, as a separate replica would.
    async fn start(ns: &str, identity: &str) -> anyhow::Result<Self> {
        let settings = LeaseSettings {
            lease_duration: LEASE_DURATION,
            renew_deadline: RENEW_DEADLINE,
            retry_period: RETRY_PERIOD,
            ..LeaseSettings::new(ns, LEASE, identity)
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (leadership, task) = leader::spawn(client().await?, settings, async move {
            let _ = stopped.await;
        });
        Ok(Self {
            identity: identity.to_owned(),
            leadership,
            stop: Some(stop),
            task,
        })
    }

    /// Graceful shutdown: waits until the task has released the lease.
    async fn shut_down(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await??;
        Ok(())
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        // A failing test must not leave its candidates electing.
        self.task.abort();
    }
}

async fn holder(leases: &Api<Lease>) -> anyhow::Result<Option<String>> {
    let lease = leases.get(LEASE).await?;
    Ok(lease
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Waits until `candidate` leads, failing the test after `deadline`.
async fn until_leads(candidate: &Candidate, deadline: Duration) -> anyhow::Result<()> {
    poll_until(
        &format!("{} to lead", candidate.identity),
        deadline,
        POLL,
        || async {
            if candidate.leadership.is_leader() {
                Ok(())
            } else {
                Err("not leading".to_owned())
            }
        },
    )
    .await?;
    Ok(())
}

/// Starts `a`, waits until it leads, then starts `b` and lets it observe
/// the lease for a couple of periods, so `b` is a warmed-up standby.
async fn leader_and_standby(ns: &str) -> anyhow::Result<(Candidate, Candidate)> {
    let a = Candidate::start(ns, "replica-a").await?;
    until_leads(&a, LEASE_DURATION + SLACK).await?;
    let b = Candidate::start(ns, "replica-b").await?;
    let warm = Instant::now() + 2 * RETRY_PERIOD;
    // Meanwhile the standby must never lead while the leader renews.
    poll_until(
        "standby to observe the lease",
        2 * RETRY_PERIOD + SLACK,
        POLL,
        || async {
            if b.leadership.is_leader() {
                return Ok(Err(()));
            }
            if Instant::now() >= warm {
                Ok(Ok(()))
            } else {
                Err("observing".to_owned())
            }
        },
    )
    .await?
    .map_err(|()| anyhow::anyhow!("the standby leads while the leader renews"))?;
    anyhow::ensure!(
        a.leadership.is_leader(),
        "the first candidate stopped leading"
    );
    Ok((a, b))
}

#[tokio::test]
async fn exactly_one_of_two_candidates_leads() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "leader-one").await?;
    let leases: Api<Lease> = Api::namespaced(client, &ns.name);
    let a = Candidate::start(&ns.name, "replica-a").await?;
    let b = Candidate::start(&ns.name, "replica-b").await?;

    let leader = poll_until(
        "one candidate to lead",
        LEASE_DURATION + SLACK,
        POLL,
        || async {
            match (a.leadership.is_leader(), b.leadership.is_leader()) {
                (true, false) => Ok(Ok(&a)),
                (false, true) => Ok(Ok(&b)),
                (true, true) => Ok(Err(())),
                (false, false) => Err("no leader yet".to_owned()),
            }
        },
    )
    .await?
    .map_err(|()| anyhow::anyhow!("both candidates lead"))?;
    println!("{} leads", leader.identity);

    // Over several renewals, never both, and the leader stays put.
    let watch_until = Instant::now() + 4 * RETRY_PERIOD;
    while Instant::now() < watch_until {
        let leaders = [&a, &b].iter().filter(|c| c.leadership.is_leader()).count();
        anyhow::ensure!(leaders <= 1, "both candidates lead");
        anyhow::ensure!(
            leader.leadership.is_leader(),
            "the leader changed without cause"
        );
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(
        holder(&leases).await?.as_deref(),
        Some(leader.identity.as_str())
    );

    a.shut_down().await?;
    b.shut_down().await?;
    Ok(())
}

#[tokio::test]
async fn a_crashed_leader_is_replaced_within_the_lease_duration() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "leader-crash").await?;
    let leases: Api<Lease> = Api::namespaced(client, &ns.name);
    let (a, b) = leader_and_standby(&ns.name).await?;

    // A crash: the task stops without releasing anything.
    a.task.abort();
    let crashed_at = Instant::now();
    until_leads(&b, LEASE_DURATION + RETRY_PERIOD + SLACK).await?;
    let handover = crashed_at.elapsed();
    println!(
        "handover after a crash: {handover:?} (lease {LEASE_DURATION:?}, retry {RETRY_PERIOD:?})"
    );
    assert!(
        !a.leadership.is_leader(),
        "an aborted election still claims leadership"
    );
    // The crashed leader may have renewed just before the crash, so the
    // standby must wait out (nearly) a full lease: taking over before the
    // old leader's renew deadline would mean two leaders.
    assert!(
        handover >= RENEW_DEADLINE,
        "took over after {handover:?}, before the old leader's renew deadline"
    );
    assert!(
        handover <= LEASE_DURATION + RETRY_PERIOD + SLACK,
        "{handover:?}"
    );
    assert_eq!(holder(&leases).await?.as_deref(), Some("replica-b"));

    b.shut_down().await?;
    Ok(())
}

#[tokio::test]
async fn a_graceful_shutdown_hands_over_at_once() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "leader-release").await?;
    let leases: Api<Lease> = Api::namespaced(client, &ns.name);
    let (a, b) = leader_and_standby(&ns.name).await?;

    let stopped_at = Instant::now();
    let mut a_view = a.leadership.clone();
    a.shut_down().await?;
    assert!(!a_view.is_leader());
    a_view.lost().await;
    until_leads(&b, 2 * RETRY_PERIOD + SLACK).await?;
    let handover = stopped_at.elapsed();
    println!("handover after a graceful shutdown: {handover:?} (retry {RETRY_PERIOD:?})");
    assert!(
        handover < LEASE_DURATION,
        "{handover:?}: the standby waited out the lease, so it was not released"
    );
    let lease = leases.get(LEASE).await?;
    let spec = lease.spec.unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-b"));
    assert!(spec.lease_transitions.unwrap_or_default() >= 1, "{spec:?}");

    // The last replica shutting down leaves the lease without holder.
    b.shut_down().await?;
    assert_eq!(holder(&leases).await?, None);
    Ok(())
}

#[tokio::test]
async fn an_overwritten_lease_makes_the_leader_step_down_at_once() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "leader-stolen").await?;
    let leases: Api<Lease> = Api::namespaced(client, &ns.name);
    let a = Candidate::start(&ns.name, "replica-a").await?;
    until_leads(&a, LEASE_DURATION + SLACK).await?;

    // The leader renews concurrently, so overwrite with the usual
    // read-modify-replace, re-reading on conflict.
    let (sent_at, overwritten_at) = poll_until(
        "the lease to be overwritten",
        Duration::from_secs(10),
        POLL,
        || {
            let leases = leases.clone();
            async move {
                let sent_at = Instant::now();
                let mut lease = leases.get(LEASE).await.map_err(|e| e.to_string())?;
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.holder_identity = Some("intruder".to_owned());
                spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
                leases
                    .replace(LEASE, &PostParams::default(), &lease)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((sent_at, Instant::now()))
            }
        },
    )
    .await?;

    let mut view = a.leadership.clone();
    tokio::time::timeout(RENEW_DEADLINE, view.lost())
        .await
        .map_err(|_| anyhow::anyhow!("still leading {RENEW_DEADLINE:?} after the overwrite"))?;
    let stepped_down = overwritten_at.elapsed();
    println!("step-down after the lease was overwritten: {stepped_down:?}");
    assert!(stepped_down <= RENEW_DEADLINE, "{stepped_down:?}");
    // It did not fight the intruder: the lease still names it.
    assert_eq!(holder(&leases).await?.as_deref(), Some("intruder"));

    // The intruder never renews, so once its lease expires by our
    // observation the candidate takes over again.
    until_leads(&a, LEASE_DURATION + RETRY_PERIOD + SLACK).await?;
    // Measured from before the overwrite was sent: the candidate cannot
    // have seen it earlier.
    let retaken = sent_at.elapsed();
    println!("re-acquired from the silent intruder after {retaken:?}");
    assert!(
        retaken >= LEASE_DURATION,
        "{retaken:?}: took the intruder's fresh lease"
    );
    a.shut_down().await?;
    Ok(())
}
