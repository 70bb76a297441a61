//! Part 1: the stop path in this process. Each abort gets a bare pod on a
//! kwok node and a PodChaos `pod-failure` naming it, labelled as the
//! operator labels a run's experiments; once Chaos Mesh reports it injected,
//! `drill::stop::stop` is timed from just before the call (the decision)
//! until Chaos Mesh reported the target recovered and until the object was
//! gone. The baseline alternates with it: the same kind of object removed
//! by a plain delete, as `kubectl delete` sends it, watched until gone (the
//! stop path watches its deletes the same way).

use std::time::{Duration, Instant};

use flashsale_bench::ms;
use flashsale_controller_drill::{chaos, stop};
use flashsale_e2e::{drill::create_kwok_pods, wait::poll_until};
use flashsale_kit::{clock::Clock, clock::SystemClock, leader::Leadership};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ListParams, PostParams},
};
use serde_json::json;

use super::chaos::{pod_chaos, until_injected};
use flashsale_e2e::kube::until_gone;

/// The drill label of the benchmark's own experiments.
const DRILL: &str = "bench";
/// Label of the pods of this part, so no drill's selector finds them.
const PART_OF: &str = "bench-stop";
/// How long the fault would last if nothing stopped it.
const FAULT: Duration = Duration::from_secs(300);

/// Every timing of the part, in ms; `recovered[i]`, `gone[i]` and
/// `deleted[i]` come from the same pair.
#[derive(Debug, Default)]
pub struct Measured {
    /// Decision → Chaos Mesh reported the target recovered.
    pub recovered: Vec<f64>,
    /// Decision → the object gone.
    pub gone: Vec<f64>,
    /// Plain delete → the object gone.
    pub deleted: Vec<f64>,
}

/// `aborts` stops, each followed by a plain delete, in `namespace`.
pub async fn measure(
    client: &Client,
    namespace: &str,
    aborts: usize,
    bound: Duration,
) -> anyhow::Result<Measured> {
    let pairs: Vec<(String, String)> = (0..aborts)
        .map(|i| (format!("stop-{i:04}"), format!("delete-{i:04}")))
        .collect();
    let names: Vec<&str> = pairs
        .iter()
        .flat_map(|(stopped, deleted)| [stopped.as_str(), deleted.as_str()])
        .collect();
    create_pods(client, namespace, &names, bound).await?;
    let api = pod_chaos(client, namespace);
    let leadership = Leadership::always();
    let mut measured = Measured::default();
    for (i, (stopped_pod, deleted_pod)) in pairs.iter().enumerate() {
        let run = inject(&api, namespace, stopped_pod, bound).await?;
        let selector = chaos::run_selector(DRILL, &run);
        // As the guard's abort does: the run's objects are known by name.
        let known = [(chaos::Kind::PodChaos, object_name(&run))];
        let decided = SystemClock.now();
        let stopped = stop::stop(
            client,
            &leadership,
            &SystemClock,
            stop::Scope {
                namespace,
                selector: &selector,
                known: &known,
            },
            bound,
        )
        .await?;
        let (Some(recovered_at), Some(gone_at)) = (stopped.recovered_at, stopped.gone_at) else {
            anyhow::bail!("the stop of {run} did not finish: {stopped:?}");
        };
        anyhow::ensure!(stopped.experiments == 1, "{stopped:?}");
        let (recovered, gone) = (since(decided, recovered_at), since(decided, gone_at));

        let run = inject(&api, namespace, deleted_pod, bound).await?;
        let started = Instant::now();
        api.delete(&object_name(&run), &DeleteParams::background())
            .await?;
        let deleted =
            ms(until_gone(&api, &chaos::run_selector(DRILL, &run), started, bound).await?);
        eprintln!(
            "  abort {}/{aborts}: stop recovered {recovered:.1} ms, gone {gone:.1} ms | plain delete gone {deleted:.1} ms",
            i + 1
        );
        measured.recovered.push(recovered);
        measured.gone.push(gone);
        measured.deleted.push(deleted);
    }
    // Out of the way of the drills' parts.
    Api::<Pod>::namespaced(client.clone(), namespace)
        .delete_collection(
            &DeleteParams::background(),
            &ListParams::default().labels(&format!("app.kubernetes.io/part-of={PART_OF}")),
        )
        .await?;
    Ok(measured)
}

/// Ms from `from` to `to`.
fn since(from: Timestamp, to: Timestamp) -> f64 {
    let elapsed: SignedDuration = to.duration_since(from);
    elapsed.as_secs_f64() * 1e3
}

fn object_name(run: &str) -> String {
    format!("{DRILL}-{run}-fail")
}

/// A PodChaos failing `pod` until stopped, injected; its run id, the pod's
/// name (unique in the namespace).
async fn inject(
    api: &Api<DynamicObject>,
    namespace: &str,
    pod: &str,
    bound: Duration,
) -> anyhow::Result<String> {
    let run = pod.to_owned();
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": chaos::CHAOS_MESH_API_VERSION,
        "kind": "PodChaos",
        "metadata": {
            "name": object_name(&run),
            "namespace": namespace,
            "labels": chaos::run_labels(DRILL, &run),
        },
        "spec": {
            "action": "pod-failure",
            "mode": "all",
            "duration": chaos::go_duration(FAULT),
            "selector": {"namespaces": [namespace], "pods": {namespace: [pod]}},
        },
    }))?;
    api.create(&PostParams::default(), &object).await?;
    until_injected(api, &chaos::run_selector(DRILL, &run), bound).await?;
    Ok(run)
}

/// Bare pods named `names` on kwok nodes, once every one is Ready.
async fn create_pods(
    client: &Client,
    namespace: &str,
    names: &[&str],
    bound: Duration,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let count = names.len();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let metadata = json!({"labels": {"app.kubernetes.io/part-of": PART_OF}});
    create_kwok_pods(&api, &names, &metadata, ("app", "app:bench")).await?;
    let params = ListParams::default().labels(&format!("app.kubernetes.io/part-of={PART_OF}"));
    poll_until(
        &format!("{count} pods Ready"),
        bound,
        Duration::from_millis(250),
        || async {
            let pods = api.list(&params).await.map_err(|e| e.to_string())?;
            let ready = pods
                .items
                .iter()
                .filter(|pod| flashsale_observe::pods::is_ready(pod))
                .count();
            if ready == count {
                Ok(())
            } else {
                Err(format!("{ready} of {count} Ready"))
            }
        },
    )
    .await?;
    Ok(())
}
