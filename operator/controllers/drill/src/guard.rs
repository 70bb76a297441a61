//! The guards of the runs this replica drives, and
//! `/guard/<ns>/<drill>/<run>`, the dead-man endpoint each run's Chaos Mesh
//! StatusCheck probes. The path names the run: a leftover run's check is
//! never kept healthy by the next run of the same drill.
//!
//! A guard is the task that drives one run (see [`super::execute`]); this
//! module holds what the task shares with the reconcile (the run's
//! progress) and with the endpoint (when the verdict was last healthy).
//! The endpoint answers 200 only while a healthy verdict is younger than
//! the drill's `staleAfter`: a guard that stopped, a replica that lost the
//! lease or a process that died all fall silent, and Chaos Mesh then ends
//! the run's chaos by itself.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::json;
use tokio::{
    sync::{OwnedRwLockReadGuard, RwLock},
    task::AbortHandle,
};

use flashsale_api::reasons::DrillReason;
use flashsale_api::{chaosdrill::DrillPhase, chaosdrill::RunRecord};

/// Where a run is, as its guard reports it to the reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// The drill's phase while this run lasts.
    pub phase: DrillPhase,
    /// The run's record so far; `outcome` set once it ended.
    pub record: RunRecord,
}

impl Progress {
    /// Whether the run ended (its outcome is known).
    pub fn finished(&self) -> bool {
        self.record.outcome.is_some()
    }
}

/// One run's guard.
pub struct Guard {
    /// The drill's uid: a drill deleted and recreated under the same name
    /// is another drill.
    pub uid: String,
    /// The run id.
    pub run: String,
    stale_after: Duration,
    state: Mutex<State_>,
    task: Mutex<Option<AbortHandle>>,
    /// Held (read) by every create of the run's Chaos Mesh objects until
    /// the apiserver answered it, even when the task that asked is stopped;
    /// `true` once a stop closed it (write), which waits for those in
    /// flight. So nothing of the run lands after a stop listed it.
    creates: Arc<RwLock<bool>>,
    /// The run-now request that started the run, if one did: a look at a
    /// cached drill older than the run's first status write sees it again,
    /// and it is this run, not a new request to refuse.
    request: Option<String>,
}

struct State_ {
    healthy_at: Option<Instant>,
    verdict: DrillReason,
    progress: Progress,
    end: Option<(DrillReason, String)>,
}

impl Guard {
    /// A guard for run `run` of the drill `uid`, starting at `progress`.
    pub fn new(uid: String, run: String, stale_after: Duration, progress: Progress) -> Self {
        Self {
            uid,
            run,
            stale_after,
            state: Mutex::new(State_ {
                healthy_at: None,
                verdict: DrillReason::Waiting,
                progress,
                end: None,
            }),
            task: Mutex::new(None),
            creates: Arc::default(),
            request: None,
        }
    }

    /// The guard of a run that the run-now request `request` started.
    #[must_use]
    pub fn started_by(self, request: Option<String>) -> Self {
        Self { request, ..self }
    }

    /// Whether `request` is the one that started this run.
    pub fn started(&self, request: &str) -> bool {
        self.request.as_deref() == Some(request)
    }

    /// A pass for one create of the run's objects, held until its request
    /// is answered; `None` once the run is being stopped.
    pub async fn create_pass(&self) -> Option<OwnedRwLockReadGuard<bool>> {
        let pass = self.creates.clone().read_owned().await;
        (!*pass).then_some(pass)
    }

    /// Refuses every later create of the run, once those in flight were
    /// answered: what the run created is then what a list shows.
    pub async fn close_creates(&self) {
        *self.creates.write().await = true;
    }

    fn state(&self) -> MutexGuard<'_, State_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the latest verdict; `healthy` renews the endpoint's 200.
    pub fn verdict(&self, reason: DrillReason, healthy: bool) {
        let mut state = self.state();
        state.verdict = reason;
        if healthy {
            state.healthy_at = Some(Instant::now());
        }
    }

    /// Silences the endpoint at once (an abort, or the end of the run).
    pub fn silence(&self, reason: DrillReason) {
        let mut state = self.state();
        state.verdict = reason;
        state.healthy_at = None;
    }

    /// Whether a healthy verdict is younger than `staleAfter`, and the
    /// latest verdict's reason.
    pub fn fresh(&self) -> (bool, DrillReason) {
        let state = self.state();
        let fresh = state
            .healthy_at
            .is_some_and(|at| at.elapsed() <= self.stale_after);
        (fresh, state.verdict)
    }

    /// Asks the run to end at its next look (the drill's current spec no
    /// longer allows it); the first ask wins.
    pub fn ask_to_end(&self, reason: DrillReason, message: String) {
        self.state().end.get_or_insert((reason, message));
    }

    /// Why the run was asked to end, if it was.
    pub fn end_asked(&self) -> Option<(DrillReason, String)> {
        self.state().end.clone()
    }

    /// Updates the run's progress.
    pub fn update(&self, change: impl FnOnce(&mut Progress)) {
        change(&mut self.state().progress);
    }

    /// The run's progress.
    pub fn progress(&self) -> Progress {
        self.state().progress.clone()
    }

    /// Attaches the task driving the run, so dropping the guard stops it.
    pub fn attach(&self, task: AbortHandle) {
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    /// Whether the task driving the run still runs.
    pub fn running(&self) -> bool {
        self.task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|task| !task.is_finished())
    }

    fn stop_task(&self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }
}

/// The guards of this replica, by `namespace/drill`.
#[derive(Default, Clone)]
pub struct Guards {
    inner: Arc<Mutex<HashMap<String, Arc<Guard>>>>,
}

impl Guards {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Guard>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The guard of `key`, if this replica drives a run of it.
    pub fn get(&self, key: &str) -> Option<Arc<Guard>> {
        self.map().get(key).cloned()
    }

    /// Registers `guard` under `key`, stopping any guard it replaces.
    pub fn insert(&self, key: &str, guard: Arc<Guard>) {
        if let Some(old) = self.map().insert(key.to_owned(), guard) {
            old.stop_task();
        }
    }

    /// Forgets `key`'s guard, stopping its task if it still runs.
    pub fn remove(&self, key: &str) {
        if let Some(old) = self.map().remove(key) {
            old.stop_task();
        }
    }

    /// Forgets every guard of `namespace`, stopping their tasks; what they
    /// were, by key.
    pub fn remove_namespace(&self, namespace: &str) -> Vec<(String, Arc<Guard>)> {
        let prefix = format!("{namespace}/");
        let mut map = self.map();
        let keys: Vec<String> = map
            .keys()
            .filter(|key| key.starts_with(&prefix))
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|key| {
                let guard = map.remove(&key)?;
                guard.stop_task();
                Some((key, guard))
            })
            .collect()
    }

    /// Forgets `key`'s guard if it guards a run of the drill `uid`, stopping
    /// its task; the guard, if it did.
    pub fn remove_drill(&self, key: &str, uid: &str) -> Option<Arc<Guard>> {
        let mut map = self.map();
        if map.get(key).is_none_or(|guard| guard.uid != uid) {
            return None;
        }
        let guard = map.remove(key)?;
        guard.stop_task();
        Some(guard)
    }

    /// Every guard, by key.
    pub fn all(&self) -> Vec<(String, Arc<Guard>)> {
        self.map()
            .iter()
            .map(|(key, guard)| (key.clone(), guard.clone()))
            .collect()
    }

    /// Stops every guard's task and forgets them all: the replica stopped
    /// leading, and a guard that cannot write must not seem alive.
    pub fn clear(&self) {
        for (_, guard) in self.map().drain() {
            guard.stop_task();
        }
    }

    /// The `/guard/{namespace}/{drill}/{run}` endpoint.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/guard/{namespace}/{drill}/{run}", get(answer))
            .with_state(self.clone())
    }
}

async fn answer(
    State(guards): State<Guards>,
    Path((namespace, drill, run)): Path<(String, String, String)>,
) -> Response {
    let Some(guard) = guards
        .get(&format!("{namespace}/{drill}"))
        .filter(|guard| guard.run == run)
    else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "healthy": false,
                "verdict": DrillReason::NoGuard,
                "message": format!("this replica guards no run {run} of {namespace}/{drill}"),
            })),
        )
            .into_response();
    };
    let (fresh, verdict) = guard.fresh();
    let code = if fresh {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(json!({"healthy": fresh, "verdict": verdict, "run": guard.run})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress() -> Progress {
        Progress {
            phase: DrillPhase::SteadyState,
            record: RunRecord::default(),
        }
    }

    #[test]
    fn the_guard_is_fresh_only_after_a_healthy_verdict_and_until_silenced() {
        let guard = Guard::new("u".into(), "r".into(), Duration::from_secs(5), progress());
        assert_eq!(guard.fresh(), (false, DrillReason::Waiting));
        guard.verdict(DrillReason::Healthy, true);
        assert_eq!(guard.fresh(), (true, DrillReason::Healthy));
        guard.verdict(DrillReason::Waiting, false);
        assert_eq!(
            guard.fresh(),
            (true, DrillReason::Waiting),
            "still within staleAfter"
        );
        guard.silence(DrillReason::SloBreached);
        assert_eq!(guard.fresh(), (false, DrillReason::SloBreached));
    }

    #[tokio::test]
    async fn a_stopped_run_waits_for_its_creates_in_flight_then_refuses_more() {
        let guard = Arc::new(Guard::new(
            "u".into(),
            "r".into(),
            Duration::from_secs(5),
            progress(),
        ));
        let pass = guard.create_pass().await;
        assert!(pass.is_some());
        let stopping = {
            let guard = guard.clone();
            tokio::spawn(async move { guard.close_creates().await })
        };
        tokio::task::yield_now().await;
        assert!(!stopping.is_finished(), "a create in flight holds the stop");
        drop(pass);
        assert!(stopping.await.is_ok());
        assert!(
            guard.create_pass().await.is_none(),
            "a create after the stop"
        );
    }

    #[test]
    fn a_healthy_verdict_goes_stale_after_stale_after() {
        let guard = Guard::new("u".into(), "r".into(), Duration::ZERO, progress());
        guard.verdict(DrillReason::Healthy, true);
        std::thread::sleep(Duration::from_millis(2));
        assert!(!guard.fresh().0);
    }
}
