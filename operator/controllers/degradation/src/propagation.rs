//! How far a new generation of the switches has reached the gateways: each
//! ready replica exports the generation it has in force
//! (`gateway_degradation_generation`), and the switches count as propagated
//! when every one reports at least the generation written. The verdict is
//! pure; [`await_generation`] asks the replicas until they all have it or a
//! bound passes, and measures how long that took.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use flashsale_observe::probe::Probe;

/// The gauge each gateway replica exports.
pub const GENERATION_GAUGE: &str = "gateway_degradation_generation";

/// The generation one replica has in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The pod's name.
    pub pod: String,
    /// What it reported: `None` when it exports no generation yet, `Err`
    /// when it could not be asked or its value is not a generation.
    pub generation: Result<Option<u64>, String>,
}

/// How many replicas have a generation in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Replicas at that generation or a later one.
    pub applied: i32,
    /// Replicas asked.
    pub total: i32,
    /// The others, as "pod: why", in the order asked.
    pub laggards: Vec<String>,
}

/// What waiting for a generation gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// From `started` until every replica had reported the generation;
    /// `None` when some had not within the bound, or there was no replica.
    pub elapsed_to_all: Option<Duration>,
    /// The replicas' last readings.
    pub progress: Progress,
}

/// A replica's gauge as a generation: a count, so a negative, fractional or
/// non-finite value is an error, never a generation.
fn parse_generation(reading: Result<Option<f64>, String>) -> Result<Option<u64>, String> {
    /// Above 2^53 an f64 no longer holds every integer.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match reading? {
        None => Ok(None),
        Some(value) if (0.0..=EXACT).contains(&value) && value.fract() == 0.0 => {
            // In range and integral: the cast is exact.
            Ok(Some(value as u64))
        }
        Some(value) => Err(format!("{GENERATION_GAUGE} is {value}, not a generation")),
    }
}

/// Whether a replica has `generation` (or a later one) in force.
fn has(applied: &Applied, generation: u64) -> bool {
    matches!(applied.generation, Ok(Some(seen)) if seen >= generation)
}

/// How many of the replicas have `generation` in force, and why not the
/// others.
pub fn verdict(readings: &[Applied], generation: u64) -> Progress {
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let laggards: Vec<String> = readings
        .iter()
        .filter(|replica| !has(replica, generation))
        .map(|replica| match &replica.generation {
            Ok(Some(seen)) => format!("{}: at generation {seen}", replica.pod),
            Ok(None) => format!(
                "{}: reports no generation yet (no {GENERATION_GAUGE} in its metrics)",
                replica.pod
            ),
            Err(err) => format!("{}: {err}", replica.pod),
        })
        .collect();
    Progress {
        applied: count(readings.len() - laggards.len()),
        total: count(readings.len()),
        laggards,
    }
}

/// Asks `replicas` every `poll` until all have `generation` in force or
/// `bound` has passed since `started` (when the switches were written). Each
/// replica is watched on its own, so a slow or hanging one delays neither the
/// others' readings nor the return past the bound; one that has reported the
/// generation is not asked again.
pub async fn await_generation(
    probe: &Probe,
    replicas: &[(String, SocketAddr)],
    generation: u64,
    started: Instant,
    bound: Duration,
    poll: Duration,
) -> Outcome {
    let deadline = tokio::time::Instant::from_std(started + bound);
    let unanswered = format!("no answer within {}", flashsale_api::Duration(bound));
    let watches = replicas.iter().map(|replica| {
        let unanswered = unanswered.clone();
        async move {
            let mut applied = Applied {
                pod: replica.0.clone(),
                generation: Err(unanswered),
            };
            loop {
                let ask = probe.replica_gauges(std::slice::from_ref(replica), GENERATION_GAUGE);
                let Ok(answers) = tokio::time::timeout_at(deadline, ask).await else {
                    return (applied, None);
                };
                if let Some((_, answer)) = answers.into_iter().next() {
                    applied.generation = parse_generation(answer);
                }
                if has(&applied, generation) {
                    return (applied, Some(started.elapsed()));
                }
                let next = tokio::time::Instant::now() + poll;
                if next >= deadline {
                    return (applied, None);
                }
                tokio::time::sleep_until(next).await;
            }
        }
    });
    let (readings, times): (Vec<Applied>, Vec<Option<Duration>>) =
        futures::future::join_all(watches).await.into_iter().unzip();
    // The last replica's time, if every one applied it; none without replicas.
    let elapsed_to_all = if times.iter().all(Option::is_some) {
        times.into_iter().flatten().max()
    } else {
        None
    };
    Outcome {
        elapsed_to_all,
        progress: verdict(&readings, generation),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(pod: &str, generation: Result<Option<u64>, &str>) -> Applied {
        Applied {
            pod: pod.to_owned(),
            generation: generation.map_err(str::to_owned),
        }
    }

    #[test]
    fn a_replica_counts_once_it_reports_the_generation_or_a_later_one() {
        let readings = [
            replica("a", Ok(Some(7))),
            replica("b", Ok(Some(8))),
            replica("c", Ok(Some(6))),
            replica("d", Ok(None)),
            replica("e", Err("connection refused")),
        ];
        assert_eq!(
            verdict(&readings, 7),
            Progress {
                applied: 2,
                total: 5,
                laggards: vec![
                    "c: at generation 6".to_owned(),
                    format!("d: reports no generation yet (no {GENERATION_GAUGE} in its metrics)"),
                    "e: connection refused".to_owned(),
                ],
            }
        );
        assert_eq!(
            verdict(&readings[..2], 7),
            Progress {
                applied: 2,
                total: 2,
                laggards: Vec::new(),
            }
        );
        assert_eq!(verdict(&[], 7), Progress::default());
    }

    #[test]
    fn only_a_whole_count_is_a_generation() {
        assert_eq!(parse_generation(Ok(Some(3.0))), Ok(Some(3)));
        assert_eq!(parse_generation(Ok(Some(0.0))), Ok(Some(0)));
        assert_eq!(parse_generation(Ok(None)), Ok(None));
        assert_eq!(
            parse_generation(Err("refused".into())),
            Err("refused".into())
        );
        for bad in [-1.0, 2.5, f64::NAN, f64::INFINITY, 1e300] {
            let read = parse_generation(Ok(Some(bad)));
            assert!(
                read.as_ref().is_err_and(|e| e.contains(GENERATION_GAUGE)),
                "{bad}: {read:?}"
            );
        }
    }
}
