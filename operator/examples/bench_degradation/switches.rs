//! Part 1: the benchmark writes the switches ConfigMap itself, as the
//! DegradationPolicy controller does (server-side apply, every generation
//! from `next_generation`), and times each change until every gateway
//! reports it, against a bare watch of the same object in this process.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use flashsale_controller_degradation::propagation::await_generation;
use flashsale_degradation::{
    Degradation, MANAGED_BY, MANAGED_BY_KEY, MiniGamesMode, ReviewsMode, ShopChatMode, Switches,
    next_generation,
};
use flashsale_observe::probe::Probe;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams},
};

use flashsale_bench::{Recorder, ms};

use super::{Cpu, CpuMark, MANAGER, fleet::Fleet, follow::Follower};

/// How often the gateways are asked after an untimed change.
const CATCH_UP_POLL: Duration = Duration::from_millis(10);

/// One change, in ms from just before the write was sent.
#[derive(Debug, Clone, Copy)]
pub struct Change {
    /// Until the write was answered.
    pub write: f64,
    /// Until every gateway reported the generation.
    pub gateways: f64,
    /// Until the bare watch in this process saw it.
    pub raw: f64,
}

/// One run's changes with one gateway count.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Gateway processes.
    pub gateways: usize,
    /// Every change.
    pub changes: Vec<Change>,
    /// The bare watch of changes during which no gateway was asked, ms.
    pub quiet: Vec<f64>,
    /// Asks of every gateway at once before the changes, ms each.
    pub idle_polls: Vec<f64>,
    /// CPU while the changes ran.
    pub cpu: Cpu,
}

impl Measured {
    /// Median time until every gateway had a change.
    pub fn p50(&self) -> f64 {
        Recorder::of_ms(self.changes.iter().map(|c| c.gateways)).quantile_ms(0.5)
    }

    /// Median gateways over median bare watch, in this run.
    pub fn ratio(&self) -> f64 {
        self.p50() / Recorder::of_ms(self.changes.iter().map(|c| c.raw)).quantile_ms(0.5)
    }

    /// A progress line.
    pub fn line(&self) -> String {
        let times = Recorder::of_ms(self.changes.iter().map(|c| c.gateways));
        let raw = Recorder::of_ms(self.changes.iter().map(|c| c.raw));
        format!(
            "{} gateways: p50 {:.1} ms, p99 {:.1} ms | raw-watch p50 {:.1} ms ({:.1} ms without polls) | ratio {:.2} | one poll of all {:.2} ms",
            self.gateways,
            self.p50(),
            times.quantile_ms(0.99),
            raw.quantile_ms(0.5),
            Recorder::of_ms(self.quiet.iter().copied()).quantile_ms(0.5),
            self.ratio(),
            Recorder::of_ms(self.idle_polls.iter().copied()).quantile_ms(0.5)
        )
    }
}

/// Writes the switches and follows them with a bare watch.
pub struct Switcher {
    api: Api<ConfigMap>,
    name: String,
    state: Degradation,
    follower: Follower,
}

/// Tier 2's switches (tier 0's are all normal).
fn switches(tier: u32) -> Switches {
    if tier == 0 {
        return Switches::default();
    }
    Switches {
        reviews: ReviewsMode::Queued,
        shop_chat: ShopChatMode::Throttled,
        mini_games: MiniGamesMode::Closed,
        ..Switches::default()
    }
}

impl Switcher {
    /// Writes tier 0 to the ConfigMap `name` and starts the bare watch.
    pub async fn create(
        client: &Client,
        namespace: &str,
        name: &str,
        bound: Duration,
    ) -> anyhow::Result<Self> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let follower = Follower::start(api.clone(), name);
        let mut switcher = Self {
            api,
            name: name.to_owned(),
            state: Degradation::default(),
            follower,
        };
        let state = switcher.next(0);
        switcher.write(&state).await?;
        let generation = state.generation;
        switcher.state = state;
        switcher
            .follower
            .wait_for("the ConfigMap", |s| s.generation >= generation, bound)
            .await?;
        Ok(switcher)
    }

    /// The state after the one in force, at `tier`.
    fn next(&self, tier: u32) -> Degradation {
        let now = jiff::Timestamp::now();
        Degradation {
            tier,
            generation: next_generation(self.state.generation, now),
            switches: switches(tier),
            reason: "benchmark".to_owned(),
            changed_at: Some(now),
            override_expires: None,
        }
    }

    /// Server-side applies `state`.
    async fn write(&self, state: &Degradation) -> anyhow::Result<()> {
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                // Gateways take switches only from the operator's ConfigMap;
                // the benchmark writes it in the operator's stead.
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_KEY.to_owned(),
                    MANAGED_BY.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(state.to_data()),
            ..ConfigMap::default()
        };
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&map),
            )
            .await?;
        Ok(())
    }

    /// `changes` changes, alternating tier 2 and 0, each timed until every
    /// gateway of `fleet` and the bare watch have it.
    pub async fn measure(
        &mut self,
        fleet: &Fleet,
        probe: &Probe,
        changes: usize,
        poll: Duration,
        bound: Duration,
    ) -> anyhow::Result<Measured> {
        // Every gateway follows the ConfigMap before the clock starts.
        let current = self.state.generation;
        let outcome =
            await_generation(probe, &fleet.replicas, current, Instant::now(), bound, poll).await;
        anyhow::ensure!(
            outcome.elapsed_to_all.is_some(),
            "gateways not at generation {current}: {:?}",
            outcome.progress.laggards
        );
        let mut idle_polls = Vec::new();
        for _ in 0..20 {
            idle_polls.push(ms(fleet.poll_once(probe).await));
            tokio::time::sleep(poll).await;
        }
        let pids = fleet.pids();
        let mut cpu = Cpu::default();
        let mut measured = Vec::with_capacity(changes);
        let mut quiet = Vec::with_capacity(changes);
        for _ in 0..changes {
            let before = CpuMark::take(&pids, None);
            measured.push(self.change(fleet, probe, poll, bound).await?);
            cpu.add(&before, &CpuMark::take(&pids, None));
            quiet.push(self.quiet_change(fleet, probe, bound).await?);
        }
        Ok(Measured {
            gateways: fleet.replicas.len(),
            changes: measured,
            quiet,
            idle_polls,
            cpu,
        })
    }

    /// The tier the next change switches to.
    fn flipped(&self) -> u32 {
        if self.state.tier == 0 { 2 } else { 0 }
    }

    /// From `started` until the bare watch has seen `generation`.
    async fn seen(
        &self,
        generation: u64,
        started: Instant,
        bound: Duration,
    ) -> anyhow::Result<Duration> {
        let seen = self
            .follower
            .wait_for(
                &format!("generation {generation}"),
                |s| s.generation >= generation,
                bound,
            )
            .await?;
        Ok(seen.at.saturating_duration_since(started))
    }

    /// One change timed by the gateways (asked every `poll`), the bare
    /// watch and the write's answer.
    async fn change(
        &mut self,
        fleet: &Fleet,
        probe: &Probe,
        poll: Duration,
        bound: Duration,
    ) -> anyhow::Result<Change> {
        let state = self.next(self.flipped());
        let generation = state.generation;
        let started = Instant::now();
        let write = async {
            self.write(&state).await?;
            anyhow::Ok(started.elapsed())
        };
        let gateways = await_generation(probe, &fleet.replicas, generation, started, bound, poll);
        let seen = self.seen(generation, started, bound);
        let (write, outcome, seen) = tokio::join!(write, gateways, seen);
        let write = write?;
        self.state = state;
        let gateways = outcome.elapsed_to_all.ok_or_else(|| {
            anyhow::anyhow!(
                "generation {generation} not on every gateway within {bound:?}: {:?}",
                outcome.progress.laggards
            )
        })?;
        Ok(Change {
            write: ms(write),
            gateways: ms(gateways),
            raw: ms(seen?),
        })
    }

    /// One change timed by the bare watch alone, no gateway asked while it
    /// travels: the floor without the polls' load. The gateways are awaited
    /// afterwards, untimed, so the next change starts from all of them.
    async fn quiet_change(
        &mut self,
        fleet: &Fleet,
        probe: &Probe,
        bound: Duration,
    ) -> anyhow::Result<f64> {
        let state = self.next(self.flipped());
        let generation = state.generation;
        let started = Instant::now();
        let (write, seen) = tokio::join!(self.write(&state), self.seen(generation, started, bound));
        write?;
        self.state = state;
        let seen = seen?;
        let outcome = await_generation(
            probe,
            &fleet.replicas,
            generation,
            Instant::now(),
            bound,
            CATCH_UP_POLL,
        )
        .await;
        anyhow::ensure!(
            outcome.elapsed_to_all.is_some(),
            "generation {generation} not on every gateway within {bound:?}: {:?}",
            outcome.progress.laggards
        );
        Ok(ms(seen))
    }
}
