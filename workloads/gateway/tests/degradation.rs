//! Degradation switches reaching gateway replicas from the local control
//! plane's real API server, and from a file.
//!
//! Every change must arrive within `DEADLINE` (a correctness bound, generous
//! for a loaded machine); how fast it arrives is measured by the
//! `bench_propagation` example and reported in docs/benchmarks.md.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use flashsale_degradation::{MANAGED_BY, MANAGED_BY_KEY};
use flashsale_e2e::{
    kube::{TestNamespace, client},
    stack,
    wait::Timeout,
};
use gateway::degradation::{
    MiniGamesMode, RecommendationsMode, ReviewsMode, Switchboard, Switches, watch_config_map,
    watch_file,
};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace},
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::{sync::oneshot, task::JoinHandle};

/// Generous for a loaded 2-core machine: speed is the benchmark's business.
const DEADLINE: Duration = Duration::from_secs(10);
/// The switches of tier 2 in these tests.
const SPIKE: &str = r#"{"recommendations":"static","reviews":"queued","miniGames":"closed"}"#;

/// A running source, stopped through its `stop` future.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    fn config_map(client: &Client, ns: &str, name: &str, board: &Switchboard) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(watch_config_map(
            client.clone(),
            ns.to_owned(),
            name.to_owned(),
            board.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self { stop, task }
    }

    fn file(path: &Path, board: &Switchboard) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(watch_file(path.to_owned(), board.clone(), async move {
            let _ = stopped.await;
        }));
        Self { stop, task }
    }

    /// Stops the source and checks it ends promptly.
    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(5), self.task).await??;
        Ok(())
    }
}

/// Every generation `board` publishes, collected until all its clones are
/// dropped.
fn history(board: &Switchboard) -> JoinHandle<Vec<u64>> {
    let mut updates = board.subscribe();
    tokio::spawn(async move {
        let mut seen = vec![updates.borrow_and_update().generation];
        while updates.changed().await.is_ok() {
            seen.push(updates.borrow_and_update().generation);
        }
        seen
    })
}

/// Deletes the test's namespace and waits for the API server to take the
/// request: `TestNamespace`'s drop only spawns the delete, which the test
/// runtime's shutdown cancels. A failed test keeps its namespace to look at.
async fn delete(client: &Client, ns: TestNamespace) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .delete(&ns.name, &DeleteParams::background())
        .await?;
    Ok(())
}

/// `seen` only went up, ended at `last`, and never held `refused`.
fn assert_monotonic_without(seen: &[u64], refused: u64, last: u64) {
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert!(!seen.contains(&refused), "{seen:?}");
    assert_eq!(seen.last(), Some(&last), "{seen:?}");
}

/// Time from `since` until `board` holds `generation` or more.
async fn reached(board: &Switchboard, generation: u64, since: Instant) -> anyhow::Result<Duration> {
    let mut updates = board.subscribe();
    let reached = tokio::time::timeout(
        DEADLINE,
        updates.wait_for(|state| state.generation >= generation),
    )
    .await;
    match reached {
        Ok(Ok(_)) => Ok(since.elapsed()),
        _ => Err(Timeout {
            what: format!("generation {generation}"),
            waited: since.elapsed(),
            last: format!("{:?}", board.current()),
        }
        .into()),
    }
}

fn data(
    generation: u64,
    tier: u32,
    switches: Option<&str>,
    reason: &str,
) -> BTreeMap<String, String> {
    let mut data = BTreeMap::from([
        ("tier".to_owned(), tier.to_string()),
        ("generation".to_owned(), generation.to_string()),
        ("reason".to_owned(), reason.to_owned()),
        ("changedAt".to_owned(), jiff::Timestamp::now().to_string()),
    ]);
    if let Some(switches) = switches {
        data.insert("switches".to_owned(), switches.to_owned());
    }
    data
}

/// Writes the ConfigMap's data the way the operator does: server-side apply
/// of the whole `data`, so keys left out are removed, with its label.
async fn publish(
    api: &Api<ConfigMap>,
    name: &str,
    data: BTreeMap<String, String>,
) -> anyhow::Result<()> {
    publish_labelled(api, name, data, json!({MANAGED_BY_KEY: MANAGED_BY})).await
}

async fn publish_labelled(
    api: &Api<ConfigMap>,
    name: &str,
    data: BTreeMap<String, String>,
    labels: serde_json::Value,
) -> anyhow::Result<()> {
    let map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name, "labels": labels },
        "data": data,
    });
    api.patch(
        name,
        &PatchParams::apply("flashsale-operator").force(),
        &Patch::Apply(&map),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn two_replicas_follow_the_config_map_and_keep_the_last_good_state() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "degradation").await?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let name = "sale-degradation";
    publish(&api, name, data(1, 0, None, "sale opened")).await?;

    let boards = [Switchboard::new(), Switchboard::new()];
    let histories = boards.each_ref().map(history);
    let sources = boards
        .each_ref()
        .map(|board| Running::config_map(&client, &ns.name, name, board));
    for board in &boards {
        reached(board, 1, Instant::now()).await?;
    }

    // Tier 2 and back, a few times: both replicas follow every change.
    for generation in 2..=7 {
        let (tier, switches) = if generation % 2 == 0 {
            (2, Some(SPIKE))
        } else {
            (0, None)
        };
        publish(&api, name, data(generation, tier, switches, "load ratio")).await?;
        let written = Instant::now();
        let (a, b) = tokio::join!(
            reached(&boards[0], generation, written),
            reached(&boards[1], generation, written)
        );
        a?;
        b?;
    }
    for board in &boards {
        let state = board.current();
        assert_eq!(state.tier, 0);
        assert_eq!(state.switches, Switches::default());
    }

    publish(&api, name, data(8, 2, Some(SPIKE), "spike")).await?;
    for board in &boards {
        reached(board, 8, Instant::now()).await?;
        let state = board.current();
        assert_eq!((state.tier, state.reason.as_str()), (2, "spike"));
        assert_eq!(
            state.switches,
            Switches {
                recommendations: RecommendationsMode::Static,
                reviews: ReviewsMode::Queued,
                mini_games: MiniGamesMode::Closed,
                ..Switches::default()
            }
        );
        assert!(state.changed_at.is_some());
    }

    // An unknown mode is refused; the later valid update still applies.
    publish(
        &api,
        name,
        data(9, 3, Some(r#"{"reviews":"queud"}"#), "typo"),
    )
    .await?;
    publish(
        &api,
        name,
        data(10, 1, Some(r#"{"shopChat":"throttled"}"#), "fixed"),
    )
    .await?;
    for board in &boards {
        reached(board, 10, Instant::now()).await?;
        assert_eq!(board.current().reason, "fixed");
    }

    // Deleted: the state stays; recreated with a higher generation: applied.
    api.delete(name, &DeleteParams::default()).await?;
    publish(&api, name, data(11, 1, None, "recreated")).await?;
    for board in &boards {
        reached(board, 11, Instant::now()).await?;
    }

    for source in sources {
        source.stop().await?;
    }
    drop(boards);
    for history in histories {
        let seen = history.await?;
        // Watch events arrive in order, so generation 10 arriving proves 9
        // was seen and refused; no replica ever went back (not even to 0 on
        // the delete). Quick successive values may be coalesced, so only the
        // order and the absences are checked.
        assert_monotonic_without(&seen, 9, 11);
    }
    delete(&client, ns).await
}

#[tokio::test]
async fn a_watch_started_before_the_config_map_exists_picks_it_up() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "degradation-late").await?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let name = "late-degradation";
    let board = Switchboard::new();
    let source = Running::config_map(&client, &ns.name, name, &board);

    publish(
        &api,
        name,
        data(4, 1, Some(r#"{"voucherPush":"deferred"}"#), "late"),
    )
    .await?;
    reached(&board, 4, Instant::now()).await?;
    assert_eq!(board.current().reason, "late");
    source.stop().await?;
    delete(&client, ns).await
}

/// Someone else's ConfigMap of the degradation name (no operator label)
/// switches nothing; the operator's, once labelled, does.
#[tokio::test]
async fn a_config_map_without_the_operators_label_is_ignored() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "degradation-foreign").await?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let name = "foreign-degradation";
    // A higher generation than the operator's next write: had the board
    // taken it, the operator's state would be refused as stale.
    publish_labelled(
        &api,
        name,
        data(50, 2, Some(SPIKE), "not the operator's"),
        json!({}),
    )
    .await?;
    let board = Switchboard::new();
    let source = Running::config_map(&client, &ns.name, name, &board);
    let mut updates = board.subscribe();
    publish(&api, name, data(3, 1, None, "the operator's")).await?;
    reached(&board, 3, Instant::now()).await?;
    let seen = updates.borrow_and_update().clone();
    assert_eq!(
        (seen.generation, seen.tier, seen.reason.as_str()),
        (3, 1, "the operator's")
    );
    source.stop().await?;
    delete(&client, ns).await
}

#[tokio::test]
async fn a_hand_edited_generation_does_not_freeze_the_gateways() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "degradation-edited").await?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let name = "edited-degradation";
    let clock = || u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0);
    let first = clock();
    publish(&api, name, data(first, 1, None, "the operator's")).await?;
    let board = Switchboard::new();
    let source = Running::config_map(&client, &ns.name, name, &board);
    reached(&board, first, Instant::now()).await?;

    // Someone sets the generation to the largest number by hand.
    publish(&api, name, data(u64::MAX, 2, Some(SPIKE), "by hand")).await?;
    // The operator's next state, at the clock, is taken: the edit was
    // refused, so it never stood above every later state.
    let next = clock().max(first + 1);
    publish(&api, name, data(next, 0, None, "the operator's next")).await?;
    reached(&board, next, Instant::now()).await?;
    let seen = board.current();
    assert_eq!(
        (seen.generation, seen.tier, seen.reason.as_str()),
        (next, 0, "the operator's next")
    );
    source.stop().await?;
    delete(&client, ns).await
}

/// The gateway's RBAC can be get/list/watch on the one ConfigMap name.
#[tokio::test]
async fn a_role_for_the_single_config_map_is_enough() -> anyhow::Result<()> {
    let admin = client().await?;
    let ns = TestNamespace::create(&admin, "degradation-rbac").await?;
    let name = "rbac-degradation";
    let role = Role {
        metadata: ObjectMeta {
            name: Some("gateway-degradation".to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".to_owned()]),
            resource_names: Some(vec![name.to_owned()]),
            verbs: ["get", "list", "watch"].map(str::to_owned).to_vec(),
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &role)
        .await?;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("gateway-degradation".to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: "gateway-degradation".to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: "gateway".to_owned(),
            namespace: Some(ns.name.clone()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &binding)
        .await?;
    let mut config = kube::Config::infer().await?;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{}:gateway", ns.name));
    let gateway = Client::try_from(config)?;

    let api = Api::<ConfigMap>::namespaced(admin.clone(), &ns.name);
    publish(
        &api,
        name,
        data(3, 2, Some(r#"{"orderHistory":"last7Days"}"#), "rbac"),
    )
    .await?;
    let board = Switchboard::new();
    let source = Running::config_map(&gateway, &ns.name, name, &board);
    // The watcher retries with backoff until the binding is in effect.
    reached(&board, 3, Instant::now()).await?;
    source.stop().await?;

    // And the role is really that narrow.
    let all = Api::<ConfigMap>::namespaced(gateway, &ns.name)
        .list(&ListParams::default())
        .await;
    assert!(
        matches!(&all, Err(kube::Error::Api(status)) if status.code == 403),
        "listing every ConfigMap must be forbidden: {all:?}"
    );
    delete(&admin, ns).await
}

/// Replaces the file in one step, as the docs of `watch_file` ask, so a
/// poll never reads it half-written.
fn write(path: &Path, content: impl AsRef<[u8]>) -> anyhow::Result<()> {
    let next = path.with_extension("next");
    std::fs::write(&next, content)?;
    std::fs::rename(&next, path)?;
    Ok(())
}

/// Checks that `board` keeps `generation` through several polls of the file
/// source: a dwell for a negative check, not a wait for readiness (that a
/// refused input changed nothing has no event to wait for).
async fn stays(board: &Switchboard, generation: u64) -> anyhow::Result<()> {
    let mut updates = board.subscribe();
    let dwell = Duration::from_millis(250);
    let changed = tokio::time::timeout(dwell, updates.changed()).await;
    anyhow::ensure!(changed.is_err(), "the board changed: {:?}", board.current());
    anyhow::ensure!(
        board.current().generation == generation,
        "{:?}",
        board.current()
    );
    Ok(())
}

/// A folder removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn create() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(stack::unique_name("degradation"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn the_file_source_follows_rewrites_and_keeps_the_last_good_state() -> anyhow::Result<()> {
    let dir = TempDir::create()?;
    let path = dir.0.join("degradation.yaml");
    write(&path, "tier: \"0\"\ngeneration: \"1\"\n")?;
    let board = Switchboard::new();
    let seen = history(&board);
    let source = Running::file(&path, &board);
    reached(&board, 1, Instant::now()).await?;

    // Rewrites as JSON data maps, each followed.
    for generation in 2..=6 {
        let content = serde_json::to_vec(&data(
            generation,
            2,
            Some(r#"{"reviews":"queued"}"#),
            "file",
        ))?;
        write(&path, content)?;
        let written = Instant::now();
        reached(&board, generation, written).await?;
    }
    assert_eq!(board.current().switches.reviews, ReviewsMode::Queued);

    // Invalid content (an unknown mode) is refused: the board holds
    // generation 6 through several polls.
    write(
        &path,
        "tier: 3\ngeneration: 7\nswitches: '{\"reviews\":\"queud\"}'\n",
    )?;
    stays(&board, 6).await?;
    // A whole ConfigMap manifest is accepted.
    let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sale-degradation\n\
                    data:\n  tier: \"1\"\n  generation: \"8\"\n  \
                    switches: '{\"miniGames\":\"closed\"}'\n  reason: manifest\n";
    write(&path, manifest)?;
    reached(&board, 8, Instant::now()).await?;
    let state = board.current();
    assert_eq!((state.tier, state.reason.as_str()), (1, "manifest"));
    assert_eq!(state.switches.mini_games, MiniGamesMode::Closed);

    // A missing file keeps the state; the file back with a newer state applies.
    std::fs::remove_file(&path)?;
    stays(&board, 8).await?;
    write(&path, "tier: 0\ngeneration: 9\nreason: back\n")?;
    reached(&board, 9, Instant::now()).await?;

    source.stop().await?;
    drop(board);
    assert_monotonic_without(&seen.await?, 7, 9);
    Ok(())
}
