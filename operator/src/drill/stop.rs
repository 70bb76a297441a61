//! The stop path: pause and delete every Chaos Mesh object of a selection
//! at once, then watch Chaos Mesh confirm it. One function serves the
//! guard's abort, the end of a run, a standby's takeover and the kill
//! switch, so they all stop the same way.

use std::time::{Duration, Instant};

use futures::future::join_all;
use jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams},
};
use serde_json::json;

use super::chaos::{Kind, PAUSE_ANNOTATION, recovered};
use crate::{
    clock::Clock,
    kit::{Error, Verb},
    leader::Leadership,
};

/// How often the stop path looks again while Chaos Mesh recovers.
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
    /// What still remained at the bound, `Kind/name`.
    pub remaining: Vec<String>,
}

/// Stops everything `selector` selects in `namespace`: the pause
/// annotation and a delete on every experiment, and a delete on every
/// Workflow, all sent at once; then waits up to `bound` for the experiments
/// to be gone. Writes only while this replica leads.
pub async fn stop(
    client: &Client,
    leadership: &Leadership,
    clock: &dyn Clock,
    namespace: &str,
    selector: &str,
    bound: Duration,
) -> Result<Stopped, Error> {
    let experiments = list_all(client, namespace, selector, &Kind::EXPERIMENTS).await?;
    let workflows = list_all(client, namespace, selector, &[Kind::Workflow]).await?;
    if !leadership.is_leader() {
        return Err(Error::NotLeader);
    }
    let experiment_writes = experiments
        .iter()
        .map(|(kind, object)| pause_and_delete(client, namespace, *kind, object));
    let workflow_writes = workflows
        .iter()
        .map(|(kind, object)| delete(client, namespace, *kind, object));
    let (experiment_results, workflow_results) =
        tokio::join!(join_all(experiment_writes), join_all(workflow_writes));
    for result in experiment_results.into_iter().chain(workflow_results) {
        result?;
    }
    let mut stopped = Stopped {
        experiments: experiments.len(),
        workflows: workflows.len(),
        recovered_at: None,
        gone_at: None,
        remaining: Vec::new(),
    };
    let until = Instant::now() + bound;
    loop {
        let left = list_all(client, namespace, selector, &Kind::EXPERIMENTS).await?;
        let now = clock.now();
        if stopped.recovered_at.is_none() && left.iter().all(|(_, o)| recovered(o)) {
            stopped.recovered_at = Some(now);
        }
        if left.is_empty() {
            stopped.gone_at = Some(now);
            return Ok(stopped);
        }
        if Instant::now() >= until {
            stopped.remaining = left
                .iter()
                .map(|(kind, o)| format!("{}/{}", kind.name(), o.name_any()))
                .collect();
            return Ok(stopped);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Every object of `kinds` that `selector` selects; a kind whose CRD is
/// missing has none.
pub async fn list_all(
    client: &Client,
    namespace: &str,
    selector: &str,
    kinds: &[Kind],
) -> Result<Vec<(Kind, DynamicObject)>, Error> {
    let params = ListParams::default().labels(selector);
    let lists = kinds.iter().map(|kind| {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &kind.resource());
        let params = params.clone();
        async move {
            match api.list(&params).await {
                Ok(list) => Ok(list.items.into_iter().map(|o| (*kind, o)).collect()),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
                Err(err) => Err(Error::kube(Verb::List, kind.name(), selector)(err)),
            }
        }
    });
    let mut all = Vec::new();
    for list in join_all(lists).await {
        all.extend(list?);
    }
    Ok(all)
}

async fn pause_and_delete(
    client: &Client,
    namespace: &str,
    kind: Kind,
    object: &DynamicObject,
) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &kind.resource());
    let name = object.name_any();
    // A merge patch of the annotation alone: Chaos Mesh writes its status
    // with whole-object updates, and a full write here would conflict.
    let pause = Patch::Merge(json!({"metadata": {"annotations": {PAUSE_ANNOTATION: "true"}}}));
    let patch_params = PatchParams::default();
    let delete_params = DeleteParams::background();
    let (paused, deleted) = tokio::join!(
        api.patch(&name, &patch_params, &pause),
        api.delete(&name, &delete_params),
    );
    gone_is_fine(paused.map(drop), Verb::Apply, kind, &name)?;
    gone_is_fine(deleted.map(drop), Verb::Delete, kind, &name)
}

async fn delete(
    client: &Client,
    namespace: &str,
    kind: Kind,
    object: &DynamicObject,
) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &kind.resource());
    let name = object.name_any();
    let deleted = api.delete(&name, &DeleteParams::background()).await;
    gone_is_fine(deleted.map(drop), Verb::Delete, kind, &name)
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
