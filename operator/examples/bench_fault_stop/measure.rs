//! One kind's aborts: each injects the fault on the target gateway, waits
//! until it is seen from the pod, then ends it, alternately by the
//! operator's stop path and by a plain delete, timing the objects' removal
//! and the effect's end as the pod shows it.

use std::time::{Duration, Instant};

use flashsale_bench::ms;
use flashsale_controller_drill::{chaos, stop};
use flashsale_e2e::{inside, kube::until_gone, wait::poll_until};
use flashsale_kit::{clock::SystemClock, leader::Leadership};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, PostParams},
};

use super::faults::{DRILL, Fault, Seen, Target};

/// How often the effect is looked at while it ends.
const LOOK: Duration = Duration::from_millis(5);

/// One ending of an injected fault, in ms from the decision (the stop
/// path) or from the delete request (the baseline).
#[derive(Debug, Clone, Copy)]
pub struct Ending {
    /// Chaos Mesh reported the target recovered (the stop path only).
    pub recovered: Option<f64>,
    /// Every object of the run gone.
    pub gone: f64,
    /// The effect gone as the pod shows it (none where that is not seen).
    pub effect: Option<f64>,
}

/// A kind's endings: `stopped[i]` and `deleted[i]` alternate.
#[derive(Debug, Default)]
pub struct Measured {
    /// Ended by `drill::stop::stop`.
    pub stopped: Vec<Ending>,
    /// Ended by a plain delete watched until gone.
    pub deleted: Vec<Ending>,
}

/// Where a kind is measured: the namespace, the sale, the target pod and
/// the inventory it talks to.
pub struct Bench<'a> {
    /// The client.
    pub client: &'a Client,
    /// The namespace of the sale.
    pub namespace: &'a str,
    /// The sale's name.
    pub sale: &'a str,
    /// The gateway pod every fault targets.
    pub pod: &'a str,
    /// The inventory pod's serving address.
    pub inventory: std::net::SocketAddr,
    /// Longest wait for any one step.
    pub bound: Duration,
    /// The probes' client.
    pub http: reqwest::Client,
}

impl Bench<'_> {
    /// `aborts` pairs of `fault`, each a stop and a plain delete.
    pub async fn measure(&self, fault: Fault, aborts: usize) -> anyhow::Result<Measured> {
        let mut measured = Measured::default();
        for i in 0..aborts {
            let stopped = self.once(fault, &format!("s{i:03}"), true).await?;
            let deleted = self.once(fault, &format!("d{i:03}"), false).await?;
            eprintln!(
                "  {} {}/{aborts}: stop gone {:.1} ms, effect {} | plain delete gone {:.1} ms, effect {}",
                fault.label(),
                i + 1,
                stopped.gone,
                shown(stopped.effect),
                deleted.gone,
                shown(deleted.effect),
            );
            measured.stopped.push(stopped);
            measured.deleted.push(deleted);
        }
        Ok(measured)
    }

    /// Injects `fault` as run `run`, waits until the pod shows it, and ends
    /// it by the stop path (`by_stop`) or by a plain delete.
    async fn once(&self, fault: Fault, run: &str, by_stop: bool) -> anyhow::Result<Ending> {
        let target = self.settled().await?;
        let run = format!("{}-{run}", fault.label());
        let (kind, object) = fault.object(self.namespace, self.sale, &run, self.pod)?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), self.namespace, &kind.resource());
        let name = object.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &object).await?;
        self.until_injected(&api, &name, fault, &target).await?;
        // The effect is watched from before the decision, so its end is
        // not missed while the stop's requests go out.
        let watching = fault
            .end_is_seen()
            .then(|| self.watch_end(fault, target.clone()));
        let selector = chaos::run_selector(DRILL, &run);
        let (decided, decided_at) = (Instant::now(), Timestamp::now());
        let (recovered, gone) = if by_stop {
            let known = [(kind, name)];
            let stopped = stop::stop(
                self.client,
                &Leadership::always(),
                &SystemClock,
                stop::Scope {
                    namespace: self.namespace,
                    selector: &selector,
                    known: &known,
                },
                self.bound,
            )
            .await?;
            let (Some(recovered_at), Some(gone_at)) = (stopped.recovered_at, stopped.gone_at)
            else {
                anyhow::bail!("the stop of {run} did not finish: {stopped:?}");
            };
            (
                Some(since(decided_at, recovered_at)),
                since(decided_at, gone_at),
            )
        } else {
            api.delete(&name, &DeleteParams::background()).await?;
            (
                None,
                ms(until_gone(&api, &selector, decided, self.bound).await?),
            )
        };
        let effect = match watching {
            Some(watching) => Some(ms(watching.await??.duration_since(decided))),
            None => None,
        };
        Ok(Ending {
            recovered,
            gone,
            effect,
        })
    }

    /// The target once its pod is Ready with its gateway running: a
    /// failed or killed container comes back with a new process.
    async fn settled(&self) -> anyhow::Result<Target> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.namespace);
        let (ip, pid) = poll_until(
            &format!("{} Ready", self.pod),
            self.bound,
            Duration::from_millis(50),
            || async {
                let pod = pods.get(self.pod).await.map_err(|e| e.to_string())?;
                if !flashsale_observe::pods::is_ready(&pod) {
                    return Err("not Ready".to_owned());
                }
                let pid = inside::pid_of(&pod).map_err(|e| e.to_string())?;
                let ip = flashsale_e2e::real_node::pod_ip(&pod).map_err(|e| e.to_string())?;
                Ok((ip, pid))
            },
        )
        .await?;
        Ok(Target {
            ip,
            pid,
            inventory: self.inventory,
        })
    }

    /// Waits until Chaos Mesh reports `name` injected and the pod shows it.
    async fn until_injected(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        fault: Fault,
        target: &Target,
    ) -> anyhow::Result<()> {
        poll_until(
            &format!("{name} injected and seen in {}", self.pod),
            self.bound,
            Duration::from_millis(20),
            || async {
                let object = api.get(name).await.map_err(|e| e.to_string())?;
                match chaos::injection(&object) {
                    chaos::Injection::Injected => {}
                    other => return Err(format!("{other:?}")),
                }
                match fault.seen(target, &self.http).await {
                    Ok(Seen::Active) => Ok(()),
                    other => Err(format!("injected, the pod shows {other:?}")),
                }
            },
        )
        .await?;
        Ok(())
    }

    /// Looks at the target every 5 ms until the effect is gone: the
    /// instant it was first seen gone.
    fn watch_end(
        &self,
        fault: Fault,
        target: Target,
    ) -> tokio::task::JoinHandle<anyhow::Result<Instant>> {
        let (http, bound) = (self.http.clone(), self.bound);
        tokio::spawn(async move {
            let until = Instant::now() + bound;
            while Instant::now() < until {
                if fault.seen(&target, &http).await? == Seen::Gone {
                    return Ok(Instant::now());
                }
                tokio::time::sleep(LOOK).await;
            }
            anyhow::bail!("{} still seen in the pod after {bound:?}", fault.label())
        })
    }
}

/// Ms from `from` to `to`.
fn since(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64() * 1e3
}

fn shown(effect: Option<f64>) -> String {
    effect.map_or("n/a".to_owned(), |e| format!("{e:.1} ms"))
}
