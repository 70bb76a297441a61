//! What the operator holds for every namespace so that a drill's safety
//! rules hold at every moment of a run, not only at its start:
//!
//! - the **budget**: the pods each run took, reserved under one lock, so two
//!   runs reaching injection together (one cron tick) cannot each take the
//!   whole cap; a pod-kill's victims stay counted until the workload has as
//!   many live pods again as when they were killed;
//! - the **gate**: every Chaos Mesh object is created through it, and the
//!   kill switch closes it before it sweeps, so no run still injecting can
//!   create an object after the sweep listed the namespace.
//!
//! A new leader starts with nothing held: what earlier runs still have under
//! chaos is read from the Chaos Mesh objects each selection lists anyway.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use super::{blast, blast::Candidate};
use flashsale_api::chaosdrill::BlastRadius;

/// One run's pods of one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hold {
    /// `namespace/drill/run`.
    run: String,
    /// The workload's component label.
    component: String,
    /// The pods, by name.
    pods: BTreeSet<String>,
    /// For pods that were killed: how many live pods the workload had when
    /// they were chosen. The hold outlives the run until that many are live
    /// again, since a killed pod is gone from the list before its
    /// replacement serves.
    killed_at_live: Option<usize>,
}

/// One experiment's ask of the budget.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    /// The workload's component label.
    pub component: &'a str,
    /// The workload's pods now.
    pub candidates: &'a [Candidate],
    /// Pods of the workload that Chaos Mesh objects in the namespace name
    /// (from any run, this one's earlier experiments aside).
    pub listed: &'a BTreeSet<String>,
    /// The drill's cap.
    pub radius: &'a BlastRadius,
    /// The seed of the choice.
    pub seed: u64,
    /// Whether the experiment kills its pods (they leave the list at once).
    pub kills: bool,
}

/// The namespace's gates and holds.
#[derive(Default, Clone)]
pub struct Budgets {
    holds: Arc<Mutex<HashMap<String, Vec<Hold>>>>,
    gates: Arc<Mutex<HashMap<String, Arc<RwLock<bool>>>>>,
}

/// Why the gate refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the namespace's kill switch is on: no chaos may be created")]
pub struct GateClosed;

impl Budgets {
    fn holds(&self) -> MutexGuard<'_, HashMap<String, Vec<Hold>>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gate(&self, namespace: &str) -> Arc<RwLock<bool>> {
        self.gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(namespace.to_owned())
            .or_default()
            .clone()
    }

    /// Takes the pods of every ask for `run`, all or none, in one step no
    /// other run's selection can interleave with. The first refusal is
    /// returned with the index of its ask.
    pub fn reserve(
        &self,
        namespace: &str,
        run: &str,
        asks: &[Ask<'_>],
    ) -> Result<Vec<Vec<String>>, (usize, blast::Selection)> {
        let mut all = self.holds();
        let holds = all.entry(namespace.to_owned()).or_default();
        let mut taken: Vec<Hold> = Vec::new();
        let mut chosen = Vec::new();
        for (i, ask) in asks.iter().enumerate() {
            let live = ask.candidates.iter().filter(|c| c.live()).count();
            // A killed pod's hold ends once the workload is back to the
            // live count it had, the replacement being Ready.
            holds.retain(|h| {
                h.component != ask.component || h.killed_at_live.is_none_or(|before| live < before)
            });
            let mut under_chaos = ask.listed.clone();
            let mut pending = 0;
            for hold in holds.iter().chain(&taken) {
                if hold.component != ask.component {
                    continue;
                }
                under_chaos.extend(hold.pods.iter().cloned());
                if let Some(before) = hold.killed_at_live {
                    let gone = hold
                        .pods
                        .iter()
                        .filter(|p| !ask.candidates.iter().any(|c| &c.name == *p))
                        .count();
                    pending += gone.min(before.saturating_sub(live));
                }
            }
            match blast::select(ask.candidates, &under_chaos, pending, ask.radius, ask.seed) {
                blast::Selection::Chosen { pods, .. } => {
                    taken.push(Hold {
                        run: run.to_owned(),
                        component: ask.component.to_owned(),
                        pods: pods.iter().cloned().collect(),
                        killed_at_live: ask.kills.then_some(live),
                    });
                    chosen.push(pods);
                }
                refused => return Err((i, refused)),
            }
        }
        holds.extend(taken);
        Ok(chosen)
    }

    /// Gives back what `run` holds, once its chaos is gone. Killed pods stay
    /// counted until their replacements serve.
    pub fn release(&self, namespace: &str, run: &str) {
        if let Some(holds) = self.holds().get_mut(namespace) {
            holds.retain(|h| h.run != run || h.killed_at_live.is_some());
        }
    }

    /// Gives back what every run of `namespace` holds (the kill switch
    /// ended them all); killed pods stay counted.
    pub fn release_namespace(&self, namespace: &str) {
        if let Some(holds) = self.holds().get_mut(namespace) {
            holds.retain(|h| h.killed_at_live.is_some());
        }
    }

    /// The pods of `namespace` this replica holds, as `(component, pod)`.
    pub fn held(&self, namespace: &str) -> BTreeSet<(String, String)> {
        self.holds()
            .get(namespace)
            .into_iter()
            .flatten()
            .flat_map(|h| h.pods.iter().map(|p| (h.component.clone(), p.clone())))
            .collect()
    }

    /// Forgets everything: a new term reads what is under chaos from the
    /// Chaos Mesh objects.
    pub fn clear(&self) {
        self.holds().clear();
    }

    /// A pass through `namespace`'s gate, held while creating one object.
    pub async fn enter(&self, namespace: &str) -> Result<OwnedRwLockReadGuard<bool>, GateClosed> {
        let pass = self.gate(namespace).read_owned().await;
        if *pass { Err(GateClosed) } else { Ok(pass) }
    }

    /// Closes `namespace`'s gate, once every create under way has answered:
    /// after this returns, nothing of the operator creates chaos there
    /// until [`open`](Self::open).
    pub async fn close(&self, namespace: &str) {
        *self.gate(namespace).write().await = true;
    }

    /// Opens `namespace`'s gate again (the switch was lifted).
    pub async fn open(&self, namespace: &str) {
        let gate = self.gate(namespace);
        // Most looks find it open: no need to wait for the creates under way.
        if *gate.read().await {
            *gate.write().await = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                name: format!("p{i:02}"),
                ready: true,
                terminating: false,
            })
            .collect()
    }

    fn radius(pods: i32) -> BlastRadius {
        BlastRadius {
            max_percent: 100.0,
            max_pods: pods,
        }
    }

    fn ask<'a>(
        candidates: &'a [Candidate],
        listed: &'a BTreeSet<String>,
        radius: &'a BlastRadius,
        seed: u64,
        kills: bool,
    ) -> Ask<'a> {
        Ask {
            component: "gateway",
            candidates,
            listed,
            radius,
            seed,
            kills,
        }
    }

    #[test]
    fn two_runs_asking_at_once_share_one_cap() {
        let budgets = Budgets::default();
        let (fleet, none, cap) = (pods(10), BTreeSet::new(), radius(2));
        let first = budgets.reserve("ns", "a", &[ask(&fleet, &none, &cap, 1, false)]);
        assert_eq!(first.map(|c| c[0].len()), Ok(2));
        // The second run saw the same empty namespace when it listed: the
        // hold, not the listing, refuses it.
        let second = budgets.reserve("ns", "b", &[ask(&fleet, &none, &cap, 2, false)]);
        assert!(
            matches!(second, Err((0, blast::Selection::BudgetExhausted { .. }))),
            "{second:?}"
        );
        budgets.release("ns", "a");
        let third = budgets.reserve("ns", "b", &[ask(&fleet, &none, &cap, 2, false)]);
        assert_eq!(third.map(|c| c[0].len()), Ok(2));
    }

    #[test]
    fn a_refused_ask_takes_nothing_of_the_run() {
        let budgets = Budgets::default();
        let (fleet, none, cap) = (pods(4), BTreeSet::new(), radius(1));
        let both = [
            ask(&fleet, &none, &cap, 1, false),
            ask(&fleet, &none, &cap, 2, false),
        ];
        assert!(budgets.reserve("ns", "a", &both).is_err());
        assert!(budgets.held("ns").is_empty());
    }

    #[test]
    fn killed_pods_count_until_their_replacements_serve() {
        let budgets = Budgets::default();
        let (fleet, none, cap) = (pods(4), BTreeSet::new(), radius(1));
        let Ok(chosen) = budgets.reserve("ns", "a", &[ask(&fleet, &none, &cap, 1, true)]) else {
            panic!("the first kill is within the cap");
        };
        budgets.release("ns", "a");
        // The victim is gone and its replacement is not Ready yet.
        let mut after: Vec<Candidate> = fleet
            .iter()
            .filter(|c| c.name != chosen[0][0])
            .cloned()
            .collect();
        after.push(Candidate {
            name: "replacement".into(),
            ready: false,
            terminating: false,
        });
        let refused = budgets.reserve("ns", "b", &[ask(&after, &none, &cap, 2, false)]);
        assert!(
            matches!(refused, Err((0, blast::Selection::BudgetExhausted { .. }))),
            "{refused:?}"
        );
        if let Some(replacement) = after.last_mut() {
            replacement.ready = true;
        }
        let allowed = budgets.reserve("ns", "b", &[ask(&after, &none, &cap, 2, false)]);
        assert_eq!(allowed.map(|c| c[0].len()), Ok(1));
    }

    #[tokio::test]
    async fn a_closed_gate_refuses_and_waits_for_creates_under_way() {
        let budgets = Budgets::default();
        let pass = budgets.enter("ns").await;
        assert!(pass.is_ok());
        let closing = {
            let budgets = budgets.clone();
            tokio::spawn(async move { budgets.close("ns").await })
        };
        tokio::task::yield_now().await;
        assert!(!closing.is_finished(), "a create under way holds the close");
        drop(pass);
        assert!(closing.await.is_ok());
        assert_eq!(budgets.enter("ns").await.err(), Some(GateClosed));
        assert!(budgets.enter("other").await.is_ok());
        budgets.open("ns").await;
        assert!(budgets.enter("ns").await.is_ok());
    }
}
