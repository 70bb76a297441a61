use std::{
    sync::atomic::{AtomicUsize, Ordering},
    thread,
    time::{Duration, Instant},
};

use super::*;

const MS: Duration = Duration::from_millis(1);

/// Records `count` requests taking `rtt`, finishing one `MS` apart after
/// `*now` (which ends at the last finish).
fn feed(g: &mut Gradient, now: &mut Instant, rtt: Duration, count: usize) {
    for _ in 0..count {
        *now += MS;
        g.record(*now - rtt, *now);
    }
}

/// Runs one sample window that began at `*now`: `rtts` finish evenly over
/// its 100 ms, the last one closing it.
fn window_of(g: &mut Gradient, now: &mut Instant, rtts: &[Duration]) {
    let spacing = Duration::from_millis(100) / rtts.len() as u32;
    for rtt in rtts {
        *now += spacing;
        g.record(*now - *rtt, *now);
    }
}

/// One window of 20 requests of `rtt`.
fn window(g: &mut Gradient, now: &mut Instant, rtt: Duration) {
    window_of(g, now, &[rtt; 20]);
}

/// A controller whose startup probe measured `min_rtt`, and the time it
/// ended (10 s after the start, so later samples of seconds still began
/// after it).
fn probed(settings: Settings, min_rtt: Duration) -> (Gradient, Instant) {
    let t0 = Instant::now();
    let samples = settings.probe_samples;
    let mut g = Gradient::new(settings, t0, 1);
    let mut now = t0 + Duration::from_secs(10);
    feed(&mut g, &mut now, min_rtt, samples);
    assert!(!g.is_probing());
    (g, now)
}

fn acquire(limiter: &ConcurrencyLimiter, partition: Partition) -> Permit {
    match limiter.try_acquire(partition) {
        Ok(permit) => permit,
        Err(rejected) => panic!(
            "{partition:?} refused at {} of {}: {rejected}",
            limiter.inflight(),
            limiter.limit()
        ),
    }
}

/// A limiter past its startup probe: its limit is `initial_limit` and stays
/// there as long as the test records no further samples.
fn limiter_past_probe(settings: Settings) -> ConcurrencyLimiter {
    let samples = settings.probe_samples;
    let limiter = ConcurrencyLimiter::new(settings);
    for _ in 0..samples {
        acquire(&limiter, Partition::Core).success();
    }
    limiter
}

fn partition_settings() -> Settings {
    Settings {
        min_limit: 4,
        initial_limit: 20,
        probe_samples: 5,
        ..Settings::default()
    }
}

#[test]
fn the_startup_probe_runs_at_min_limit_then_the_initial_limit_applies() {
    let limiter = ConcurrencyLimiter::new(partition_settings());
    assert_eq!(limiter.limit(), 4);
    let held: Vec<_> = (0..4).map(|_| acquire(&limiter, Partition::Core)).collect();
    assert!(limiter.try_acquire(Partition::Core).is_err());
    for permit in held {
        permit.success();
    }
    assert_eq!(limiter.limit(), 4, "4 of 5 probe samples");
    acquire(&limiter, Partition::Core).success();
    assert_eq!(limiter.limit(), 20);
}

#[test]
fn non_core_holds_at_most_its_share_and_core_still_gets_in() {
    let limiter = limiter_past_probe(partition_settings());
    assert_eq!(limiter.limit(), 20);

    // floor(20 × 0.3) = 6 non-core slots.
    let non_core: Vec<_> = (0..6)
        .map(|_| acquire(&limiter, Partition::NonCore))
        .collect();
    let refused = limiter.try_acquire(Partition::NonCore);
    assert_eq!(
        refused.err(),
        Some(Rejected {
            retry_after: Duration::from_secs(1)
        })
    );
    // Core takes the other 14 while non-core is saturated.
    let core: Vec<_> = (0..14)
        .map(|_| acquire(&limiter, Partition::Core))
        .collect();
    assert_eq!(limiter.inflight(), 20);
    assert_eq!(
        limiter.try_acquire(Partition::Core).err(),
        Some(Rejected {
            retry_after: Duration::from_secs(1)
        })
    );
    drop(non_core);
    drop(core);
    assert_eq!(limiter.inflight(), 0);
}

#[test]
fn core_may_use_the_whole_limit_and_then_non_core_is_refused() {
    let limiter = limiter_past_probe(partition_settings());
    let core: Vec<_> = (0..20)
        .map(|_| acquire(&limiter, Partition::Core))
        .collect();
    assert!(limiter.try_acquire(Partition::Core).is_err());
    assert!(limiter.try_acquire(Partition::NonCore).is_err());
    assert_eq!(limiter.inflight(), 20);
    drop(core);
    acquire(&limiter, Partition::NonCore).ignore();
}

#[test]
fn non_core_gets_at_least_one_slot() {
    // Probing at limit 4 with share 0.1: floor(0.4) = 0, raised to 1.
    let limiter = ConcurrencyLimiter::new(Settings {
        min_limit: 4,
        non_core_share: 0.1,
        ..Settings::default()
    });
    let held = acquire(&limiter, Partition::NonCore);
    assert!(limiter.try_acquire(Partition::NonCore).is_err());
    acquire(&limiter, Partition::Core).ignore();
    held.ignore();
}

#[test]
fn permits_release_their_slot_on_success_ignore_and_drop() {
    let limiter = limiter_past_probe(partition_settings());
    let a = acquire(&limiter, Partition::Core);
    let b = acquire(&limiter, Partition::NonCore);
    let c = acquire(&limiter, Partition::NonCore);
    let clone = limiter.clone();
    assert_eq!(clone.inflight(), 3);
    a.success();
    assert_eq!(limiter.inflight(), 2);
    b.ignore();
    assert_eq!(limiter.inflight(), 1);
    drop(c);
    assert_eq!(limiter.inflight(), 0);

    // The non-core count was released too: all 6 non-core slots are free.
    let again: Vec<_> = (0..6)
        .map(|_| acquire(&limiter, Partition::NonCore))
        .collect();
    assert!(limiter.try_acquire(Partition::NonCore).is_err());
    assert_eq!(limiter.inflight(), 6);
    drop(again);
    assert_eq!(limiter.inflight(), 0);
}

#[test]
fn contended_acquires_never_exceed_the_limit() {
    let limiter = limiter_past_probe(partition_settings());
    let (peak, non_core_peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let non_core_now = AtomicUsize::new(0);
    thread::scope(|s| {
        for worker in 0..8 {
            let (limiter, peak) = (&limiter, &peak);
            let (non_core_now, non_core_peak) = (&non_core_now, &non_core_peak);
            s.spawn(move || {
                let partition = if worker % 2 == 0 {
                    Partition::Core
                } else {
                    Partition::NonCore
                };
                for _ in 0..2_000 {
                    let Ok(permit) = limiter.try_acquire(partition) else {
                        continue;
                    };
                    peak.fetch_max(limiter.inflight(), Ordering::Relaxed);
                    if partition == Partition::NonCore {
                        let n = non_core_now.fetch_add(1, Ordering::AcqRel) + 1;
                        non_core_peak.fetch_max(n, Ordering::Relaxed);
                        non_core_now.fetch_sub(1, Ordering::AcqRel);
                    }
                    thread::yield_now();
                    drop(permit);
                }
            });
        }
    });
    assert!(peak.into_inner() <= 20);
    assert!(non_core_peak.into_inner() <= 6);
    assert_eq!(limiter.inflight(), 0);
}

#[test]
fn a_probe_drops_to_min_limit_until_its_samples_arrive_then_restores_the_limit() {
    let settings = Settings::default();
    let t0 = Instant::now();
    let mut g = Gradient::new(settings.clone(), t0, 1);
    assert!(g.is_probing());
    assert_eq!((g.limit(), g.min_rtt()), (8, None));

    // Startup probe: 25 samples of 20 ms.
    let mut now = t0 + 20 * MS;
    feed(&mut g, &mut now, 20 * MS, 24);
    assert!(g.is_probing(), "24 of 25 samples");
    assert_eq!(g.limit(), 8);
    feed(&mut g, &mut now, 20 * MS, 1);
    assert!(!g.is_probing());
    assert_eq!((g.limit(), g.min_rtt()), (50, Some(20 * MS)));

    // Windows at the target latency (gradient 1) until the next probe.
    let Some(due) = g.next_probe() else {
        panic!("no probe scheduled")
    };
    for _ in 0..5 {
        window(&mut g, &mut now, 22 * MS);
    }
    let before = g.limit();
    assert!(before > 50, "the limit grew by its headroom: {before}");
    assert!(now < due);

    // The first completion after the due time starts the probe.
    now = due;
    g.record(now - 22 * MS, now);
    assert!(g.is_probing());
    assert_eq!(g.limit(), 8);
    let probe_start = now;

    // Requests that started before the probe are not samples.
    for _ in 0..30 {
        now += MS;
        g.record(probe_start - MS, now);
    }
    assert!(g.is_probing());
    // The upstream got faster: the baseline goes down to 10 ms.
    feed(&mut g, &mut now, 10 * MS, 24);
    assert!(g.is_probing());
    assert_eq!(g.limit(), 8);
    feed(&mut g, &mut now, 10 * MS, 1);
    assert!(!g.is_probing());
    assert_eq!((g.limit(), g.min_rtt()), (before, Some(10 * MS)));

    // The next probe can raise it again.
    let Some(due) = g.next_probe() else {
        panic!("no probe scheduled")
    };
    now = due;
    g.record(now - MS, now);
    assert!(g.is_probing());
    now += 15 * MS;
    feed(&mut g, &mut now, 15 * MS, 25);
    assert_eq!((g.limit(), g.min_rtt()), (before, Some(15 * MS)));
}

#[test]
fn probe_intervals_are_jittered_within_ten_percent() {
    let interval = Settings::default().probe_interval;
    let mut seen = Vec::new();
    for seed in 0..50 {
        let t0 = Instant::now();
        let mut g = Gradient::new(Settings::default(), t0, seed);
        let mut now = t0 + MS;
        feed(&mut g, &mut now, MS, 25);
        let Some(due) = g.next_probe() else {
            panic!("no probe scheduled")
        };
        let gap = due - now;
        assert!(
            gap >= interval.mul_f64(0.9) && gap <= interval.mul_f64(1.1),
            "{gap:?}"
        );
        seen.push(gap);
    }
    seen.sort();
    seen.dedup();
    assert!(seen.len() > 40, "jitter is not applied: {seen:?}");
}

#[test]
fn each_window_moves_the_limit_by_the_gradient_plus_headroom() {
    let (mut g, mut now) = probed(Settings::default(), 10 * MS);
    assert_eq!(g.limit(), 50);
    // Unloaded (10 ms against a target of 11 ms): 50 × 1.1 + sqrt(55) = 62.4.
    window(&mut g, &mut now, 10 * MS);
    assert_eq!(g.limit(), 62);
    assert_eq!(g.sample_rtt(), Some(10 * MS));
    // Twice the target: 62 × 0.5 + sqrt(31) = 36.6.
    window(&mut g, &mut now, 22 * MS);
    assert_eq!(g.limit(), 37);
    // Far too slow: the gradient stops at 0.5 (18.5 + 4.3 = 22.8).
    window(&mut g, &mut now, 200 * MS);
    assert_eq!(g.limit(), 23);
    // Instant answers: the gradient stops at 2 (46 + 6.8 = 52.8).
    window(&mut g, &mut now, Duration::ZERO);
    assert_eq!(g.limit(), 53);
}

#[test]
fn a_window_needs_its_duration_and_ten_samples() {
    let (mut g, mut now) = probed(Settings::default(), 10 * MS);
    // 9 fast samples over 200 ms: too few to move the limit.
    for _ in 0..9 {
        now += 20 * MS;
        g.record(now - MS, now);
    }
    assert_eq!((g.limit(), g.sample_rtt()), (50, None));
    // The 10th closes the window.
    now += MS;
    g.record(now - MS, now);
    assert_eq!(g.sample_rtt(), Some(MS));
    assert_eq!(g.limit(), 100 + 10);
    // 50 samples within 50 ms: the window is not over yet.
    feed(&mut g, &mut now, 30 * MS, 50);
    assert_eq!(g.sample_rtt(), Some(MS));
}

#[test]
fn the_window_rtt_is_the_median_not_the_mean() {
    let (mut g, mut now) = probed(Settings::default(), 10 * MS);
    // 11 samples of 10 ms and 9 of one second: the median is 10 ms.
    let mut rtts = [10 * MS; 20];
    rtts[..9].fill(Duration::from_secs(1));
    window_of(&mut g, &mut now, &rtts);
    assert_eq!(g.sample_rtt(), Some(10 * MS));
    assert_eq!(g.limit(), 62);
}

#[test]
fn the_limit_stays_within_its_bounds() {
    let settings = Settings {
        min_limit: 5,
        max_limit: 60,
        ..Settings::default()
    };
    let (mut g, mut now) = probed(settings, 10 * MS);
    for _ in 0..10 {
        window(&mut g, &mut now, MS);
    }
    assert_eq!(g.limit(), 60);
    // 60 → 36 → 22 → 14 → 10 → 7 → 5, then twice more at 5.
    for _ in 0..8 {
        window(&mut g, &mut now, Duration::from_secs(1));
    }
    assert!(!g.is_probing());
    assert_eq!(g.limit(), 5);
}

#[test]
fn five_windows_at_min_limit_start_a_probe_early_and_refresh_a_stale_baseline() {
    let (mut g, mut now) = probed(Settings::default(), 10 * MS);
    // The upstream is ten times slower for good: 50 → 30 → 19 → 13 → 9 → 8.
    let mut windows = 0;
    while g.limit() > 8 {
        window(&mut g, &mut now, 100 * MS);
        windows += 1;
    }
    assert_eq!(windows, 5);
    for _ in 0..3 {
        window(&mut g, &mut now, 100 * MS);
        assert!(!g.is_probing());
    }
    window(&mut g, &mut now, 100 * MS);
    assert!(g.is_probing(), "the 5th window at min_limit starts a probe");
    // The probe measures the new latency; the limit can grow again.
    now += 100 * MS;
    feed(&mut g, &mut now, 100 * MS, 25);
    assert_eq!((g.limit(), g.min_rtt()), (8, Some(100 * MS)));
    window(&mut g, &mut now, 100 * MS);
    assert!(g.limit() > 8);
}

#[test]
fn the_retry_hint_is_the_sample_rtt_in_whole_seconds_at_least_one() {
    let (mut g, mut now) = probed(Settings::default(), 10 * MS);
    assert_eq!(retry_after_secs(&g), 1, "10 ms min RTT, no window yet");
    window(&mut g, &mut now, Duration::from_millis(2_300));
    assert_eq!(retry_after_secs(&g), 3);
    window(&mut g, &mut now, Duration::from_secs(2));
    assert_eq!(retry_after_secs(&g), 2);
    let fresh = Gradient::new(Settings::default(), Instant::now(), 1);
    assert_eq!(retry_after_secs(&fresh), 1, "before any measurement");
}

#[test]
fn settings_are_made_consistent() {
    let s = Settings {
        min_limit: 0,
        max_limit: 0,
        initial_limit: 500,
        non_core_share: f64::NAN,
        probe_interval: Duration::MAX,
        probe_samples: 0,
        buffer: -1.0,
        ..Settings::default()
    }
    .sanitized();
    assert_eq!((s.min_limit, s.max_limit, s.initial_limit), (1, 1, 1));
    assert_eq!((s.non_core_share, s.buffer, s.probe_samples), (0.0, 0.0, 1));
    assert_eq!(s.probe_interval, MAX_PROBE_INTERVAL);
}
