//! `drill run-now | abort | abort-all | resume-all | history`: each asks the
//! operator through the drill's (or the namespace's) annotations, then
//! reads what happened back from the drill's status.

use std::{collections::BTreeMap, io::Write};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Resource, ResourceExt, api::Patch};
use serde_json::{Value, json};

use flashsale_api::{
    ChaosDrill,
    chaosdrill::{
        ABORT_ANNOTATION, ABORT_REASON_ANNOTATION, FORCE_ANNOTATION, KILL_SWITCH_ANNOTATION,
        RUN_NOW_ANNOTATION, RunOutcome, RunRecord,
    },
};

use crate::{
    args::WriteArgs,
    failure::{Call, Described, Failure},
    output::Out,
    report::span,
    session::{DRILLS, Session, merge_params, request_id},
    wait::{self, Waited},
};

/// `drill run-now`: one request, answered by a run or a refusal.
pub async fn run_now<O: Write, E: Write>(
    session: &mut Session,
    name: &str,
    force: bool,
    write: &WriteArgs,
    out: &mut Out<O>,
    err: &mut E,
) -> Result<(), Failure> {
    let api: Api<ChaosDrill> = session.namespaced();
    session.get::<ChaosDrill>(DRILLS, name).await?;
    let user = session.user().await;
    let asked = Timestamp::now();
    let request = request_id();
    let mut annotations = BTreeMap::from([(RUN_NOW_ANNOTATION, request.clone())]);
    if force {
        annotations.insert(FORCE_ANNOTATION, format!("{user}: {}", write.reason));
    }
    let written = annotate(session, &api, name, &annotations, write.dry_run).await?;
    if write.dry_run {
        let text = format!(
            "drill {}/{name}: would ask for run {request}{} (dry run: nothing changed)\n",
            session.namespace,
            if force { " outside the windows" } else { "" }
        );
        return out.emit(&annotations, &text);
    }
    let note = format!(
        "{user} asked for a run{}: {}",
        if force {
            " outside the windows (force)"
        } else {
            ""
        },
        write.reason
    );
    let reference = written.object_ref(&());
    session
        .record(reference, "RunRequested", "RunNow", note, err)
        .await;
    let answered = wait::until(api, name, write.timeout.0, |d| {
        let status = d.status.as_ref()?;
        (status.last_run_request.as_deref() == Some(&request)).then(|| answer(d, &request))
    })
    .await;
    let answer = waited(answered, write, "answer the run-now request")?;
    let took = ms_since(asked);
    match answer {
        Answer::Started(run) => {
            let text = format!(
                "drill {}/{name}: run {} started {took} after the request; follow it with `kubectl flashsale status {}`\n",
                session.namespace,
                run.id,
                sale_of(&written)
            );
            out.emit(&run, &text)
        }
        Answer::Refused(run) => {
            let text = format!(
                "drill {}/{name}: request refused {took} after it was made: {} ({})\n",
                session.namespace,
                run.message.clone().unwrap_or_default(),
                run.reason.clone().unwrap_or_default()
            );
            out.emit(&run, &text)?;
            Err(Failure::Refused(format!(
                "the operator refused the run: {}",
                run.reason.unwrap_or_default()
            )))
        }
    }
}

enum Answer {
    Started(RunRecord),
    Refused(RunRecord),
}

/// What the operator did with `request`, as the run it recorded for it
/// says: the run it started (still running or already finished), or its
/// refusal. No clock is compared, so a skewed clock cannot mislead it.
fn answer(drill: &ChaosDrill, request: &str) -> Answer {
    let status = drill.status.clone().unwrap_or_default();
    let mine = |run: &RunRecord| run.request.as_deref() == Some(request);
    if let Some(run) = status.current_run.filter(mine) {
        return Answer::Started(run);
    }
    match status.history.into_iter().find(mine) {
        Some(run) if run.outcome == Some(RunOutcome::Skipped) => Answer::Refused(run),
        Some(run) => Answer::Started(run),
        // A request that came as a run ended is taken as handled.
        None => Answer::Refused(RunRecord {
            id: request.to_owned(),
            reason: Some("NotStarted".to_owned()),
            message: Some(
                "the operator took the request as a run ended and started none; ask again"
                    .to_owned(),
            ),
            ..RunRecord::default()
        }),
    }
}

/// `drill abort`: the run in progress ends, its faults removed.
pub async fn abort<O: Write, E: Write>(
    session: &mut Session,
    name: &str,
    write: &WriteArgs,
    out: &mut Out<O>,
    err: &mut E,
) -> Result<(), Failure> {
    let api: Api<ChaosDrill> = session.namespaced();
    let drill = session.get::<ChaosDrill>(DRILLS, name).await?;
    let Some(run) = drill.status.as_ref().and_then(|s| s.current_run.clone()) else {
        let last = drill
            .status
            .as_ref()
            .and_then(|s| s.history.first())
            .map(|r| {
                format!(
                    "; the last run, {}, ended {}",
                    r.id,
                    r.outcome.map_or("?", |o| o.name())
                )
            })
            .unwrap_or_default();
        return Err(Failure::Refused(format!(
            "drill {name} has no run in progress{last}"
        )));
    };
    let user = session.user().await;
    let why = format!("{user}: {}", write.reason);
    let annotations = BTreeMap::from([
        (ABORT_ANNOTATION, run.id.clone()),
        (ABORT_REASON_ANNOTATION, why.clone()),
    ]);
    let asked = Timestamp::now();
    let written = annotate(session, &api, name, &annotations, write.dry_run).await?;
    if write.dry_run {
        let text = format!(
            "drill {}/{name}: would abort run {} (dry run: nothing changed)\n",
            session.namespace, run.id
        );
        return out.emit(&annotations, &text);
    }
    let note = format!("{user} asked to abort run {}: {}", run.id, write.reason);
    let reference = written.object_ref(&());
    session
        .record(reference, "AbortRequested", "Abort", note, err)
        .await;
    let ended = wait::until(api, name, write.timeout.0, |d| finished(d, &run.id)).await;
    let ended = waited(ended, write, "end the run")?;
    let text = format!(
        "drill {}/{name}: {} (read back {} after the request)\n",
        session.namespace,
        ending(&ended, asked),
        ms_since(asked)
    );
    out.emit(&ended, &text)
}

/// The run `id` once it is in the history.
fn finished(drill: &ChaosDrill, id: &str) -> Option<RunRecord> {
    drill
        .status
        .as_ref()?
        .history
        .iter()
        .find(|r| r.id == id)
        .cloned()
}

/// A finished run in a sentence with its figures: how long after the
/// guard's decision (or else after the request at `asked`) every fault was
/// gone.
fn ending(run: &RunRecord, asked: Timestamp) -> String {
    let mut text = format!(
        "run {} {} ({})",
        run.id,
        run.outcome.map_or("ended", |o| o.name()),
        run.reason.as_deref().unwrap_or("no reason given")
    );
    match (run.abort_latency, &run.gone_at) {
        (Some(latency), _) => {
            text.push_str(&format!(", every fault gone {latency} after the decision"))
        }
        (None, Some(gone)) => {
            let after = gone.0.duration_since(asked).as_millis().max(0);
            text.push_str(&format!(", every fault gone {after} ms after the request"));
        }
        (None, None) => text.push_str(", nothing was injected"),
    }
    if let (Some(started), Some(ended)) = (&run.started_at, &run.ended_at) {
        text.push_str(&format!(", after {} of run", span(started.0, ended.0)));
    }
    text
}

/// `drill abort-all` and `drill resume-all`: the namespaces' kill switch.
pub async fn kill_switch<O: Write, E: Write>(
    session: &mut Session,
    on: bool,
    write: &WriteArgs,
    out: &mut Out<O>,
    err: &mut E,
) -> Result<(), Failure> {
    let drills: Vec<ChaosDrill> = session.list(DRILLS, session.all_namespaces).await?;
    let mut namespaces: Vec<String> = drills.iter().filter_map(ResourceExt::namespace).collect();
    if !session.all_namespaces {
        namespaces = vec![session.namespace.clone()];
    }
    namespaces.sort();
    namespaces.dedup();
    if namespaces.is_empty() {
        return Err(Failure::Refused(
            "no namespace has a ChaosDrill: there is no drill to stop".to_owned(),
        ));
    }
    let running: Vec<(String, String, String)> = drills
        .iter()
        .filter_map(|d| {
            Some((
                d.namespace()?,
                d.name_any(),
                d.status.as_ref()?.current_run.as_ref()?.id.clone(),
            ))
        })
        .collect();
    let asked = Timestamp::now();
    switch(session, &namespaces, on, write.dry_run).await?;
    let user = session.user().await;
    let verb = if on { "on" } else { "off" };
    if write.dry_run {
        let text = format!(
            "would turn the kill switch {verb} in {} (dry run: nothing changed)\n",
            namespaces.join(", ")
        );
        return out.emit(&namespaces, &text);
    }
    for drill in drills
        .iter()
        .filter(|d| d.namespace().is_some_and(|ns| namespaces.contains(&ns)))
    {
        let note = format!(
            "{user} turned the kill switch {verb} for namespace {}: {}",
            drill.namespace().unwrap_or_default(),
            write.reason
        );
        let reason = if on { "KillSwitchOn" } else { "KillSwitchOff" };
        let reference = drill.object_ref(&());
        session
            .record(reference, reason, "KillSwitch", note, err)
            .await;
    }
    let mut text = format!("kill switch {verb} in {}\n", namespaces.join(", "));
    if !on {
        return out.emit(&namespaces, &text);
    }
    let ended = await_ended(session, &running, write, asked, &mut text).await?;
    out.emit(&ended, &text)
}

/// Sets (`on`) or removes the kill switch annotation of `namespaces`.
async fn switch(
    session: &Session,
    namespaces: &[String],
    on: bool,
    dry_run: bool,
) -> Result<(), Failure> {
    let value = if on { json!("true") } else { Value::Null };
    let api: Api<Namespace> = Api::all(session.client.clone());
    let params = merge_params(dry_run);
    for ns in namespaces {
        let patch = json!({"metadata": {"annotations": {KILL_SWITCH_ANNOTATION: value}}});
        api.patch(ns, &params, &Patch::Merge(patch))
            .await
            .described(Call {
                verb: "patch",
                resource: "namespaces",
                name: Some(ns),
                namespace: None,
            })?;
    }
    Ok(())
}

/// Waits for each `(namespace, drill, run)` to be in its drill's history,
/// adding a line per run to `text`, its times counted from the switch at
/// `asked`.
async fn await_ended(
    session: &Session,
    running: &[(String, String, String)],
    write: &WriteArgs,
    asked: Timestamp,
    text: &mut String,
) -> Result<Vec<RunRecord>, Failure> {
    let mut ended = Vec::new();
    for (ns, name, id) in running {
        let api: Api<ChaosDrill> = Api::namespaced(session.client.clone(), ns);
        let done = wait::until(api, name, write.timeout.0, |d| finished(d, id)).await;
        let run = waited(done, write, "end the run")?;
        text.push_str(&format!(
            "drill {ns}/{name}: {} (read back {} after the switch)\n",
            ending(&run, asked),
            ms_since(asked)
        ));
        ended.push(run);
    }
    if running.is_empty() {
        text.push_str("no run was in progress\n");
    }
    Ok(ended)
}

/// `drill history`.
pub async fn history<O: Write>(
    session: &Session,
    name: &str,
    out: &mut Out<O>,
) -> Result<(), Failure> {
    let drill = session.get::<ChaosDrill>(DRILLS, name).await?;
    let runs = drill.status.map(|s| s.history).unwrap_or_default();
    let mut text = format!(
        "{:<26} {:<10} {:<24} {:>9} {:>9}  {}\n",
        "RUN", "OUTCOME", "REASON", "LASTED", "ABORT", "TARGETS"
    );
    for run in &runs {
        let lasted = match (&run.started_at, &run.ended_at) {
            (Some(s), Some(e)) => span(s.0, e.0),
            _ => "-".to_owned(),
        };
        text.push_str(&format!(
            "{:<26} {:<10} {:<24} {:>9} {:>9}  {}\n",
            run.id,
            run.outcome.map_or("-", |o| o.name()),
            run.reason.as_deref().unwrap_or("-"),
            lasted,
            run.abort_latency
                .map_or_else(|| "-".to_owned(), |d| d.to_string()),
            if run.targets.is_empty() {
                "-".to_owned()
            } else {
                run.targets.join(",")
            }
        ));
    }
    if runs.is_empty() {
        text = format!("drill {name} has not run yet\n");
    }
    out.emit(&runs, &text)
}

/// Sets `annotations` on the drill `name` (a server-side dry run when
/// asked), under this plugin's field manager.
pub async fn annotate(
    session: &Session,
    api: &Api<ChaosDrill>,
    name: &str,
    annotations: &BTreeMap<&str, String>,
    dry_run: bool,
) -> Result<ChaosDrill, Failure> {
    let params = merge_params(dry_run);
    let patch = json!({"metadata": {"annotations": annotations}});
    api.patch(name, &params, &Patch::Merge(patch))
        .await
        .described(Call {
            verb: "patch",
            resource: DRILLS,
            name: Some(name),
            namespace: Some(&session.namespace),
        })
}

fn waited<T>(
    result: Result<T, Waited<ChaosDrill>>,
    write: &WriteArgs,
    what: &str,
) -> Result<T, Failure> {
    match result {
        Ok(value) => Ok(value),
        Err(Waited::Failed(failure)) => Err(failure),
        Err(Waited::TimedOut(last)) => Err(Failure::TimedOut(format!(
            "the request is written, but the operator did not {what} within {}{}: is it running and leading?",
            write.timeout,
            last.and_then(|d| d.status)
                .and_then(|s| s.phase)
                .map(|p| format!(" (the drill is {p:?})"))
                .unwrap_or_default()
        ))),
    }
}

fn sale_of(drill: &ChaosDrill) -> String {
    drill.spec.sale_ref.name.clone()
}

/// The time since `asked`, in milliseconds.
fn ms_since(asked: Timestamp) -> String {
    format!("{} ms", Timestamp::now().duration_since(asked).as_millis())
}
