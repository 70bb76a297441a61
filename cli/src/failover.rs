//! `failover check`: asks the operator to check a drill's standby now and
//! prints each check with its numbers, as the operator recorded them.

use std::{collections::BTreeMap, io::Write, time::Instant};

use jiff::Timestamp;
use kube::{Api, Resource};

use flashsale_api::{ChaosDrill, Duration, chaosdrill::CHECK_ANNOTATION};

use crate::{
    args::WriteArgs,
    drill::annotate,
    failure::Failure,
    output::Out,
    render,
    report::{self, FailoverReport},
    session::{DRILLS, Session, request_id},
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
    let drill: ChaosDrill = session.get(DRILLS, name).await?;
    if drill.spec.failover.is_none() {
        return Err(Failure::Refused(format!(
            "drill {name} has no spec.failover: there is no standby to check"
        )));
    }
    let api: Api<ChaosDrill> = session.namespaced();
    let request = request_id();
    let started = Instant::now();
    let annotations = BTreeMap::from([(CHECK_ANNOTATION, request.clone())]);
    let written = annotate(session, &api, name, &annotations, write.dry_run).await?;
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
    let reference = written.object_ref(&());
    session
        .record(reference, "ReadinessCheckRequested", "Check", note, err)
        .await;
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
