//! The controller against a simulated server, in simulated time: the server
//! has capacity C, and a request admitted as the n-th in flight takes
//! `BASE × max(1, n / C)` (±10 % noise). A closed loop of `CLIENTS` clients,
//! far more than C, always wants to send: a slot that frees under the limit
//! is taken at once, the heaviest pressure the limiter can see.
//!
//! Expected steady state, from the update rule: above C the window RTT is
//! `BASE × L / C`, so `L' = C (1 + buffer) + sqrt(C (1 + buffer))` whatever L
//! was; with C = 100 and buffer 0.1 that is 120.5 (1.2 C), and latency is
//! 1.2 × BASE. Below C latency is BASE and the limit grows. The bands the
//! tests allow (0.8 C to 1.6 C) leave room for noise and rounding while
//! still failing on a limit that creeps or collapses.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    time::{Duration, Instant},
};

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{Settings, gradient::Gradient};

const BASE: Duration = Duration::from_millis(10);
const CLIENTS: usize = 1000;
/// How often the simulation notes the controller's state.
const OBSERVE_EVERY: Duration = Duration::from_millis(100);

/// The controller's state at one moment of simulated time.
struct Observation {
    at: Duration,
    limit: usize,
    probing: bool,
    min_rtt: Option<Duration>,
}

struct Sim {
    gradient: Gradient,
    t0: Instant,
    now: Instant,
    capacity: usize,
    /// Requests in flight as (finished, started), earliest finish first.
    inflight: BinaryHeap<Reverse<(Instant, Instant)>>,
    noise: StdRng,
    next_observation: Instant,
    observations: Vec<Observation>,
    /// Per second of simulated time: total latency and requests finished.
    latency: Vec<(Duration, u32)>,
    /// Probes begun after the startup one.
    probes: usize,
}

impl Sim {
    fn new(capacity: usize) -> Self {
        let t0 = Instant::now();
        let mut sim = Self {
            gradient: Gradient::new(Settings::default(), t0, 42),
            t0,
            now: t0,
            capacity,
            inflight: BinaryHeap::new(),
            noise: StdRng::seed_from_u64(7),
            next_observation: t0,
            observations: Vec::new(),
            latency: Vec::new(),
            probes: 0,
        };
        sim.admit();
        sim
    }

    /// Fills the free slots under the limit with waiting clients.
    fn admit(&mut self) {
        let slots = self.gradient.limit().min(CLIENTS);
        while self.inflight.len() < slots {
            let n = self.inflight.len() + 1;
            let load = (n as f64 / self.capacity as f64).max(1.0);
            let latency = BASE.mul_f64(load * self.noise.random_range(0.9..1.1));
            self.inflight.push(Reverse((self.now + latency, self.now)));
        }
    }

    /// Runs every completion up to `end` (since the start), each freeing a
    /// slot that a client takes at once.
    fn run_until(&mut self, end: Duration) {
        let end = self.t0 + end;
        while let Some(&Reverse((finished, started))) = self.inflight.peek() {
            if finished > end {
                break;
            }
            self.inflight.pop();
            self.observe_until(finished);
            self.now = finished;
            let was_probing = self.gradient.is_probing();
            self.gradient.record(started, finished);
            if !was_probing && self.gradient.is_probing() {
                self.probes += 1;
            }
            self.note_latency(finished - started);
            self.admit();
        }
        self.observe_until(end);
        self.now = end;
    }

    fn observe_until(&mut self, until: Instant) {
        while self.next_observation <= until {
            self.observations.push(Observation {
                at: self.next_observation - self.t0,
                limit: self.gradient.limit(),
                probing: self.gradient.is_probing(),
                min_rtt: self.gradient.min_rtt(),
            });
            self.next_observation += OBSERVE_EVERY;
        }
    }

    fn note_latency(&mut self, latency: Duration) {
        let second = (self.now - self.t0).as_secs() as usize;
        if self.latency.len() <= second {
            self.latency.resize(second + 1, (Duration::ZERO, 0));
        }
        self.latency[second].0 += latency;
        self.latency[second].1 += 1;
    }

    /// The limits observed in `[from, to)` seconds, outside probes.
    fn limits(&self, from: u64, to: u64) -> Vec<usize> {
        let (from, to) = (Duration::from_secs(from), Duration::from_secs(to));
        self.observations
            .iter()
            .filter(|o| o.at >= from && o.at < to && !o.probing)
            .map(|o| o.limit)
            .collect()
    }

    /// Mean latency of the requests finished in `[from, to)` seconds, as a
    /// multiple of `BASE`.
    fn latency_ratio(&self, from: u64, to: u64) -> f64 {
        let range = &self.latency[from as usize..to as usize];
        let total: Duration = range.iter().map(|(sum, _)| *sum).sum();
        let count: u32 = range.iter().map(|(_, n)| n).sum();
        (total / count).as_secs_f64() / BASE.as_secs_f64()
    }

    /// When the limit, outside probes, first met `reached` at or after `from`
    /// seconds: the delay after `from`.
    fn first(&self, from: u64, reached: impl Fn(usize) -> bool) -> Option<Duration> {
        let from = Duration::from_secs(from);
        self.observations
            .iter()
            .find(|o| o.at >= from && !o.probing && reached(o.limit))
            .map(|o| o.at - from)
    }
}

fn mean(limits: &[usize]) -> f64 {
    limits.iter().sum::<usize>() as f64 / limits.len().max(1) as f64
}

fn assert_within(limits: &[usize], low: f64, high: f64, what: &str) {
    assert!(!limits.is_empty(), "{what}: no observations");
    let min = limits.iter().min().copied().unwrap_or_default();
    let max = limits.iter().max().copied().unwrap_or_default();
    assert!(
        min as f64 >= low && max as f64 <= high,
        "{what}: limit ranged {min}..={max}, outside {low}..={high}"
    );
}

#[test]
fn the_limit_settles_near_capacity_and_does_not_creep_across_probes() {
    let c = 100.0;
    let mut sim = Sim::new(100);
    sim.run_until(Duration::from_secs(300));

    let steady = c * 1.1 + (c * 1.1_f64).sqrt();
    let settled = sim.limits(60, 300);
    let (early, late) = (sim.limits(60, 120), sim.limits(240, 300));
    let ratio = sim.latency_ratio(240, 300);
    println!(
        "C = 100: limit {}..={} over 60-300 s; mean {:.1} in 60-120 s, {:.1} in 240-300 s \
         (formula {steady:.1}); latency {ratio:.2} × base; {} probes",
        settled.iter().min().copied().unwrap_or_default(),
        settled.iter().max().copied().unwrap_or_default(),
        mean(&early),
        mean(&late),
        sim.probes,
    );

    // Several probe intervals (30 s ± 10 %) went by.
    assert!(sim.probes >= 8, "only {} probes in 5 minutes", sim.probes);
    assert_within(&settled, 0.8 * c, 1.6 * c, "60-300 s");
    assert!(
        (mean(&late) - steady).abs() <= 0.1 * steady,
        "late mean {:.1} is not within 10 % of {steady:.1}",
        mean(&late)
    );
    // No creep: the last minute is not above an earlier one.
    assert!(
        mean(&late) <= mean(&early) * 1.05,
        "mean limit crept from {:.1} to {:.1}",
        mean(&early),
        mean(&late)
    );
    let max = |limits: &[usize]| limits.iter().max().copied().unwrap_or_default() as f64;
    assert!(
        max(&late) <= max(&early) * 1.05,
        "peak limit crept from {} to {}",
        max(&early),
        max(&late)
    );
    // Every probe measured the unloaded latency, not the loaded one.
    for o in &sim.observations {
        if let Some(min_rtt) = o.min_rtt {
            assert!(
                min_rtt >= BASE.mul_f64(0.9) && min_rtt <= BASE.mul_f64(1.1),
                "min RTT {min_rtt:?} at {:?}",
                o.at
            );
        }
    }
    assert!(ratio < 1.5, "steady latency {ratio:.2} × base");
}

#[test]
fn the_limit_follows_capacity_down_and_back_up() {
    let mut sim = Sim::new(100);
    sim.run_until(Duration::from_secs(60));
    sim.capacity = 25;
    sim.run_until(Duration::from_secs(120));
    sim.capacity = 100;
    sim.run_until(Duration::from_secs(180));

    let down = sim.first(60, |l| l as f64 <= 1.6 * 25.0);
    let up = sim.first(120, |l| l as f64 >= 0.8 * 100.0);
    let (low, high) = (sim.limits(63, 120), sim.limits(123, 180));
    println!(
        "C 100 → 25 at 60 s: limit ≤ 40 after {down:?}, mean {:.1} in 63-120 s; \
         C 25 → 100 at 120 s: limit ≥ 80 after {up:?}, mean {:.1} in 123-180 s",
        mean(&low),
        mean(&high),
    );

    assert!(
        down.is_some_and(|d| d <= Duration::from_secs(3)),
        "limit took {down:?} to follow C down"
    );
    assert_within(&low, 0.8 * 25.0, 1.6 * 25.0, "C = 25");
    assert!(
        up.is_some_and(|d| d <= Duration::from_secs(3)),
        "limit took {up:?} to grow back"
    );
    assert_within(&high, 0.8 * 100.0, 1.6 * 100.0, "C = 100 again");
}
