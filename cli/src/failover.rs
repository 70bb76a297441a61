//! `failover check`: asks the operator to check a drill's standby now and
//! prints each check with its numbers, as the operator recorded them.

use std::{io::Write, time::Instant};

use jiff::Timestamp;
use kube::{Api, Resource, api::Patch};
use serde_json::json;

use flashsale_api::{ChaosDrill, Duration, chaosdrill::CHECK_ANNOTATION};

use crate::{
    args::WriteArgs,
    failure::{Call, Described, Failure},
    output::Out,
    render,
    report::{self, FailoverReport},
    session::{FIELD_MANAGER, Session, merge_params},
    wait::{self, Waited},
};

/// Runs `failover check`; refused (exit 1) when the standby is not ready.
pub async fn check<O: Write, E: Write>(
    session: &mut Session,
    name: &str,
    write: &WriteArgs,
    out: &mut Out<O>,
    err: &mut E,
) -> Result<(), Failure> {
    let api: Api<ChaosDrill> = session.namespaced();
    let call = |verb| Call {
        verb,
        resource: "chaosdrills.flashsale.dev",
        name: Some(name),
        namespace: Some(&session.namespace),
    };
    let drill = api.get(name).await.described(call("get"))?;
    if drill.spec.failover.is_none() {
        return Err(Failure::Refused(format!(
            "drill {name} has no spec.failover: there is no standby to check"
        )));
    }
    let request = format!("{FIELD_MANAGER}-{}", Timestamp::now().as_millisecond());
    let started = Instant::now();
    let params = merge_params(write.dry_run);
    let patch = json!({"metadata": {"annotations": {CHECK_ANNOTATION: request}}});
    api.patch(name, &params, &Patch::Merge(patch))
        .await
        .described(call("patch"))?;
    if write.dry_run {
        let text = format!(
            "drill {}/{name}: would ask for readiness check {request} (dry run: nothing changed)\n",
            session.namespace
        );
        return out.emit(&request, &text);
    }
    let user = session.user().await;
    let note = format!(
        "{user} asked for a failover readiness check: {}",
        write.reason
    );
    if let Err(warning) = session
        .record(
            drill.object_ref(&()),
            "ReadinessCheckRequested",
            "Check",
            note,
        )
        .await
    {
        let _ = writeln!(err, "warning: {warning}");
    }
    let report = read_back(api, name, &request, write.timeout).await?;
    let style = out.style();
    let mut text = format!(
        "drill {}/{name}: {} (checked {} ms after the request)\n",
        session.namespace,
        render::failover_line(&report, Timestamp::now(), style),
        started.elapsed().as_millis()
    );
    for c in report.checks.iter().filter(|c| !c.passed) {
        text.push_str(&format!("  {} failed: {}\n", c.name, c.message));
    }
    out.emit(&report, &text)?;
    if report.ready {
        Ok(())
    } else {
        Err(Failure::Refused(format!(
            "the standby of drill {name} is not ready"
        )))
    }
}

/// The operator's check that answers `request`, watched for at most
/// `timeout`.
async fn read_back(
    api: Api<ChaosDrill>,
    name: &str,
    request: &str,
    timeout: Duration,
) -> Result<FailoverReport, Failure> {
    let checked = wait::until(api, name, timeout.0, |d| {
        let failover = d.status.as_ref()?.failover.as_ref()?;
        (failover.request.as_deref() == Some(request)).then(|| report::failover(failover))
    })
    .await;
    match checked {
        Ok(report) => Ok(report),
        Err(Waited::Failed(failure)) => Err(failure),
        Err(Waited::TimedOut(_)) => Err(Failure::TimedOut(format!(
            "the operator did not check the standby within {timeout}: is it running and leading?"
        ))),
    }
}
