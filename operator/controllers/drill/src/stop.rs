//! The stop path: delete every Chaos Mesh object of a selection at once
//! (pausing what cannot be deleted), then watch Chaos Mesh confirm it. One
//! function serves the guard's abort, the end of a run, a standby's
//! takeover and the kill switch, so they all stop the same way.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::{StreamExt, future::join_all, stream};
use jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, WatchEvent, WatchParams},
};
use serde_json::json;

use super::{chaos::Kind, chaos::PAUSE_ANNOTATION, chaos::recovered};
use flashsale_kit::{Error, Verb, clock::Clock, clock::Moment, leader::Leadership};

/// How often the stop path looks again when it cannot watch.
const POLL: Duration = Duration::from_millis(10);

/// What a stop did and saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Stopped {
    /// Experiment objects found and stopped.
    pub experiments: usize,
    /// Workflows deleted.
    pub workflows: usize,
    /// When Chaos Mesh reported every target recovered (or the object gone).
    pub recovered_at: Option<Timestamp>,
    /// When every experiment object was gone; `None` if some remain at the
    /// bound (Chaos Mesh down, or a target it cannot recover).
    pub gone_at: Option<Timestamp>,
    /// The same instant on the monotonic clock, for latencies.
    pub gone_after: Option<Duration>,
    /// What still remained at the bound, `Kind/name`.
    pub remaining: Vec<String>,
    /// How long the stop waited for Chaos Mesh.
    pub waited: Duration,
}

impl Stopped {
    /// What a run's record says when Chaos Mesh did not remove everything:
    /// the objects, what the operator did, and why they stay; `None` when
    /// everything went.
    pub fn not_removed(&self) -> Option<String> {
        if self.remaining.is_empty() {
            return None;
        }
        Some(format!(
            "Chaos Mesh still held {} {} after the operator deleted them: its finalizer keeps \
             each until chaos-daemon on the target's node answers and recovers the target, \
             and the operator does not strip it (the fault may still act; the object goes by \
             itself once chaos-daemon is back)",
            self.remaining.join(", "),
            flashsale_api::Duration(self.waited),
        ))
    }
}

/// What a stop removes: everything `selector` selects in `namespace`, of
/// which `known` (possibly none) are known by kind and name already.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// The label selector of everything to stop.
    pub selector: &'a str,
    /// Objects known to be selected: their deletes go out before the list
    /// answers, not after.
    pub known: &'a [(Kind, String)],
}

/// Follows the experiments until they are gone or `until`. Watched from the
/// list's versions, no delete can be missed, and each is seen the moment the
/// apiserver makes it: a poll would add up to a whole list's time to every
/// stop. A watch that fails falls back to polling.
async fn await_gone(
    client: &Client,
    (namespace, selector): (&str, &str),
    versions: &[(Kind, String)],
    progress: &mut Progress,
    clock: &dyn Clock,
    until: Instant,
) -> Result<(), Error> {
    let followed = follow(
        client, namespace, selector, versions, progress, clock, until,
    )
    .await;
    if let Err(err) = followed {
        tracing::debug!(%err, "watching the stop failed; polling instead");
        poll(client, namespace, selector, progress, clock, until).await?;
    }
    Ok(())
}

/// Stops everything `scope` selects: a delete on every experiment and
/// every Workflow, all sent at once (an experiment whose delete is refused
/// gets the pause annotation instead); then follows the experiments until
/// they are gone, at most `bound`. Writes only while this replica leads.
pub async fn stop(
    client: &Client,
    leadership: &Leadership,
    clock: &dyn Clock,
    scope: Scope<'_>,
    bound: Duration,
) -> Result<Stopped, Error> {
    let until = Instant::now() + bound;
    if !leadership.is_leader() {
        return Err(Error::NotLeader);
    }
    let Scope {
        namespace,
        selector,
        known,
    } = scope;
    // The known objects' deletes travel with the lists: an experiment the
    // list no longer shows was deleted before it, and one it shows is
    // deleted after the list's version, where the watch starts.
    let known_writes = known
        .iter()
        .map(|(kind, name)| remove(client, namespace, *kind, name));
    let (known_results, experiments, workflows) = tokio::join!(
        join_all(known_writes),
        listed(client, namespace, selector, &Kind::EXPERIMENTS),
        listed(client, namespace, selector, &[Kind::Workflow]),
    );
    let ((experiments, versions), (workflows, _)) = (experiments?, workflows?);
    let others = experiments
        .iter()
        .chain(&workflows)
        .filter(|(kind, o)| !known.iter().any(|(k, n)| k == kind && *n == o.name_any()))
        .map(|(kind, o)| (*kind, o.name_any()))
        .collect::<Vec<_>>();
    let other_writes = others
        .iter()
        .map(|(kind, name)| remove(client, namespace, *kind, name));
    for result in known_results
        .into_iter()
        .chain(join_all(other_writes).await)
    {
        result?;
    }
    let mut progress = Progress::new(&experiments);
    if !progress.done() {
        let scope = (namespace, selector);
        await_gone(client, scope, &versions, &mut progress, clock, until).await?;
    }
    let now = clock.moment();
    // Everything deleted, known or listed, counted once.
    let stopped: std::collections::BTreeSet<(Kind, String)> =
        known.iter().cloned().chain(others).collect();
    let count = |workflow: bool| {
        stopped
            .iter()
            .filter(|(kind, _)| (*kind == Kind::Workflow) == workflow)
            .count()
    };
    Ok(Stopped {
        experiments: count(false),
        workflows: count(true),
        recovered_at: progress
            .recovered_at
            .or(progress.done().then_some(now.wall)),
        gone_at: progress
            .done()
            .then(|| progress.gone_at.map_or(now.wall, |at| at.wall)),
        gone_after: progress
            .done()
            .then(|| progress.gone_at.map_or(now.mono, |at| at.mono)),
        remaining: progress
            .left
            .keys()
            .map(|(kind, name)| format!("{}/{name}", kind.name()))
            .collect(),
        waited: bound,
    })
}

/// The experiments still there, and when Chaos Mesh confirmed each step.
struct Progress {
    /// `(kind, name)` → recovered.
    left: BTreeMap<(Kind, String), bool>,
    recovered_at: Option<Timestamp>,
    gone_at: Option<Moment>,
}

impl Progress {
    fn new(experiments: &[(Kind, DynamicObject)]) -> Self {
        Self {
            left: experiments
                .iter()
                .map(|(kind, o)| ((*kind, o.name_any()), recovered(o)))
                .collect(),
            recovered_at: None,
            gone_at: None,
        }
    }

    fn done(&self) -> bool {
        self.left.is_empty()
    }

    /// Takes in what an experiment is now (`None`: gone).
    fn saw(&mut self, kind: Kind, name: String, now: Option<&DynamicObject>, at: Moment) {
        let key = (kind, name);
        match now {
            None => {
                self.left.remove(&key);
            }
            Some(object) => {
                if let Some(done) = self.left.get_mut(&key) {
                    *done = recovered(object);
                }
            }
        }
        if self.recovered_at.is_none() && self.left.values().all(|done| *done) {
            self.recovered_at = Some(at.wall);
        }
        if self.gone_at.is_none() && self.left.is_empty() {
            self.gone_at = Some(at);
        }
    }
}

/// Follows the experiments' watch events until they are gone or `until`.
async fn follow(
    client: &Client,
    namespace: &str,
    selector: &str,
    versions: &[(Kind, String)],
    progress: &mut Progress,
    clock: &dyn Clock,
    until: Instant,
) -> Result<(), kube::Error> {
    let params = WatchParams::default().labels(selector);
    let mut streams = Vec::new();
    for (kind, version) in versions {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &kind.resource());
        let kind = *kind;
        streams.push(
            api.watch(&params, version)
                .await?
                .map(move |e| (kind, e))
                .boxed(),
        );
    }
    let mut events = stream::select_all(streams);
    while !progress.done() {
        let next = tokio::time::timeout_at(until.into(), events.next()).await;
        match next {
            Err(_) => return Ok(()),
            Ok(None) => {
                return Err(kube::Error::Service(
                    "the watch ended before the experiments were gone".into(),
                ));
            }
            Ok(Some((kind, event))) => match event? {
                WatchEvent::Deleted(object) => {
                    progress.saw(kind, object.name_any(), None, clock.moment());
                }
                WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                    progress.saw(kind, object.name_any(), Some(&object), clock.moment());
                }
                WatchEvent::Bookmark(_) => {}
                WatchEvent::Error(status) => {
                    return Err(kube::Error::Api(status));
                }
            },
        }
    }
    Ok(())
}

/// Lists the experiments until they are gone or `until`.
async fn poll(
    client: &Client,
    namespace: &str,
    selector: &str,
    progress: &mut Progress,
    clock: &dyn Clock,
    until: Instant,
) -> Result<(), Error> {
    while !progress.done() && Instant::now() < until {
        let (left, _) = listed(client, namespace, selector, &Kind::EXPERIMENTS).await?;
        let now = clock.moment();
        let present: BTreeMap<(Kind, String), &DynamicObject> = left
            .iter()
            .map(|(kind, o)| ((*kind, o.name_any()), o))
            .collect();
        let known: Vec<(Kind, String)> = progress.left.keys().cloned().collect();
        for (kind, name) in known {
            let object = present.get(&(kind, name.clone())).copied();
            progress.saw(kind, name, object, now);
        }
        if !progress.done() {
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(())
}

/// Every object of `kinds` that `selector` selects, and each kind's list
/// version (to watch from); a kind whose CRD is missing has none.
async fn listed(
    client: &Client,
    namespace: &str,
    selector: &str,
    kinds: &[Kind],
) -> Result<(Vec<(Kind, DynamicObject)>, Vec<(Kind, String)>), Error> {
    let params = ListParams::default().labels(selector);
    let lists = kinds.iter().map(|kind| {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &kind.resource());
        let params = params.clone();
        async move {
            match api.list(&params).await {
                Ok(list) => Ok(Some((*kind, list))),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
                Err(err) => Err(Error::kube(Verb::List, kind.name(), selector)(err)),
            }
        }
    });
    let mut objects = Vec::new();
    let mut versions = Vec::new();
    for list in join_all(lists).await {
        let Some((kind, list)) = list? else {
            continue;
        };
        if !list.items.is_empty()
            && let Some(version) = list.metadata.resource_version
        {
            versions.push((kind, version));
        }
        objects.extend(list.items.into_iter().map(|o| (kind, o)));
    }
    Ok((objects, versions))
}

/// Every object of `kinds` that `selector` selects; a kind whose CRD is
/// missing has none.
pub async fn list_all(
    client: &Client,
    namespace: &str,
    selector: &str,
    kinds: &[Kind],
) -> Result<Vec<(Kind, DynamicObject)>, Error> {
    Ok(listed(client, namespace, selector, kinds).await?.0)
}

/// Removes one object: deletes a Workflow; deletes an experiment or, only
/// if the delete is refused, pauses it instead, so Chaos Mesh still
/// recovers its targets. Not both at once: every extra write while Chaos
/// Mesh recovers makes its whole-object status updates conflict and back
/// off, which made the stop slower in the benchmark (`docs/benchmarks.md`).
async fn remove(client: &Client, namespace: &str, kind: Kind, name: &str) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &kind.resource());
    let deleted = api.delete(name, &DeleteParams::background()).await;
    let Err(refused) = gone_is_fine(deleted.map(drop), Verb::Delete, kind, name) else {
        return Ok(());
    };
    if kind == Kind::Workflow {
        return Err(refused);
    }
    let pause = Patch::Merge(json!({"metadata": {"annotations": {PAUSE_ANNOTATION: "true"}}}));
    let paused = api.patch(name, &PatchParams::default(), &pause).await;
    match gone_is_fine(paused.map(drop), Verb::Apply, kind, name) {
        Ok(()) => {
            tracing::warn!(%refused, object = name, "delete refused; the experiment is paused instead");
            Ok(())
        }
        Err(_) => Err(refused),
    }
}

fn gone_is_fine(
    result: Result<(), kube::Error>,
    verb: Verb,
    kind: Kind,
    name: &str,
) -> Result<(), Error> {
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(Error::kube(verb, kind.name(), name)(err)),
    }
}
