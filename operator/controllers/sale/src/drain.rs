//! Whether an ended sale's order-writer has drained: a pure verdict over what
//! each ready replica reported.
//!
//! Every replica's `order_writer_consumer_lag` is the lag of the whole
//! consumer group over every partition of the topic, so the replicas report
//! the same quantity seen at slightly different times: the verdict takes the
//! largest (a sum would count the backlog once per replica). The gauge is
//! absent until a replica's first measurement succeeded, and absent is not
//! zero: the sale counts as drained only when every ready replica reported a
//! measured 0, and a replica that has not measured (or could not be asked) is
//! named in the condition message.

use flashsale_observe::replicas::{LagReading, ReplicaLag};

use super::status::Drain;

/// The drain as the replicas' readings show it.
pub fn verdict(readings: &[ReplicaLag]) -> Drain {
    if readings.is_empty() {
        return Drain::Unknown("no ready order-writer replica to ask".to_owned());
    }
    let mut unknown = Vec::new();
    let mut largest: Option<i64> = None;
    for replica in readings {
        match &replica.reading {
            LagReading::Measured(lag) => largest = largest.max(Some(*lag)),
            LagReading::NotMeasured => unknown.push(format!(
                "{} has not measured its lag yet (no order_writer_consumer_lag in its metrics)",
                replica.pod
            )),
            LagReading::Failed(err) => unknown.push(format!("{}: {err}", replica.pod)),
        }
    }
    match largest {
        _ if !unknown.is_empty() => {
            let mut message = unknown.join("; ");
            if let Some(lag) = largest.filter(|lag| *lag > 0) {
                message.push_str(&format!("; the others report {lag} events to write"));
            }
            Drain::Unknown(message)
        }
        Some(0) => Drain::Drained,
        Some(lag) => Drain::Lag(lag),
        None => Drain::Unknown("no replica reported its lag".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(pod: &str, reading: LagReading) -> ReplicaLag {
        ReplicaLag {
            pod: pod.to_owned(),
            reading,
        }
    }

    #[test]
    fn drained_only_when_every_replica_measured_zero() {
        use LagReading::{Failed, Measured, NotMeasured};
        let zero = |pod| replica(pod, Measured(0));
        assert_eq!(verdict(&[zero("a"), zero("b")]), Drain::Drained);
        // The same group lag seen by two replicas: the largest, not the sum.
        assert_eq!(
            verdict(&[replica("a", Measured(3)), replica("b", Measured(5))]),
            Drain::Lag(5)
        );
        // A replica that has not measured is not a zero.
        let Drain::Unknown(message) = verdict(&[zero("a"), replica("b", NotMeasured)]) else {
            panic!("a missing gauge counted as drained");
        };
        assert!(
            message.contains("b has not measured its lag yet"),
            "{message}"
        );
        let Drain::Unknown(message) = verdict(&[
            replica("a", Measured(7)),
            replica("b", Failed("connection refused".into())),
        ]) else {
            panic!("an unreachable replica counted");
        };
        assert_eq!(
            message,
            "b: connection refused; the others report 7 events to write"
        );
        assert!(matches!(verdict(&[]), Drain::Unknown(m) if m.contains("no ready")));
    }
}
