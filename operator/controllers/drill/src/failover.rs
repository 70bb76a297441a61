//! An active failover run as buyers see it. A [`Probe`] asks the global
//! endpoint every [`PROBE_EVERY`] which region answers (the gateways stamp
//! it on every answer), and orders through it as the run's buyer
//! ([`crate::buyer`]); [`Timeline`] turns the answers into the moment
//! buyers lost the primary, the RTO, the longest time buyers went
//! unserved and the failback, pure.
//!
//! The outage is dated from the buyers' side too: it starts at the first
//! answer the primary did not serve. A primary that drains gracefully
//! (its gateways fail their readiness and keep serving until the endpoint
//! has moved buyers away) costs buyers nothing, and its RTO is 0.
//!
//! An answer counts as served when a gateway gave it (it names a region)
//! with a status below 500; the endpoint's own error pages name none. A
//! switch counts once [`SUSTAINED`] answers in a row came from the same
//! side, so one lucky answer is not a failover; it is dated from the
//! first of them.

use std::{
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::buyer::{Fate, ORDER_EVERY, Signer, Tally};
use flashsale_kit::clock::Clock;
use flashsale_observe::standby;
use futures::{StreamExt, stream::FuturesOrdered};

/// How often the probe asks the endpoint.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// Answers in a row from one side that make a switch.
pub const SUSTAINED: u32 = 5;
/// Bound of one probe: longer, and the answer counts as none. Longer than
/// an endpoint's connect timeout and retry take, so a request it holds and
/// then sends to the standby counts as served, as the buyer saw it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Who served one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A gateway of the primary region.
    Primary,
    /// A gateway of another region, named.
    Other(String),
    /// No gateway: an error page of the endpoint, a 5xx, or nothing.
    Unserved,
}

impl Answer {
    /// Classifies the endpoint's answer (status, region stamped) against
    /// the primary's region.
    pub fn of(answer: Option<(u16, Option<String>)>, primary: &str) -> Self {
        match answer {
            Some((status, Some(region))) if status < 500 => {
                if region == primary {
                    Self::Primary
                } else {
                    Self::Other(region)
                }
            }
            _ => Self::Unserved,
        }
    }
}

/// A run of answers of one kind: when it began and how long it is.
#[derive(Debug, Clone, Default)]
struct Streak {
    since: Option<Duration>,
    count: u32,
}

impl Streak {
    /// Counts an answer at `at` that is (`hit`) or is not of the kind; the
    /// run's start once it reached [`SUSTAINED`].
    fn see(&mut self, at: Duration, hit: bool) -> Option<Duration> {
        if !hit {
            *self = Self::default();
            return None;
        }
        let since = *self.since.get_or_insert(at);
        self.count += 1;
        (self.count >= SUSTAINED).then_some(since)
    }
}

/// What the answers said, on the monotonic clock.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// The first answer not served by the primary.
    pub outage: Option<Duration>,
    /// The longest run of unserved answers so far, and the current one's
    /// start.
    pub longest_unserved: Duration,
    unserved_since: Option<Duration>,
    /// The slowest served answer from the outage until the faults'
    /// removal: an endpoint that holds requests while it retries serves
    /// them late rather than not at all.
    pub slowest: Duration,
    /// The region that took over and since when, once sustained.
    pub failed_over: Option<(Duration, String)>,
    /// When the faults were removed.
    restoring: Option<Duration>,
    /// The primary serving again since when, once sustained after
    /// `restoring`.
    pub restored: Option<Duration>,
    /// The current run of answers from `region`, or from the primary.
    streak: Streak,
    region: Option<String>,
    /// Answers seen.
    pub answers: u64,
}

impl Timeline {
    /// Takes one answer asked at `at` that took `took`.
    pub fn see(&mut self, at: Duration, answer: &Answer, took: Duration) {
        self.answers += 1;
        if self.outage.is_none() && *answer != Answer::Primary {
            self.outage = Some(at);
        }
        if self.outage.is_some() && self.restoring.is_none() && *answer != Answer::Unserved {
            self.slowest = self.slowest.max(took);
        }
        if *answer == Answer::Unserved {
            let since = *self.unserved_since.get_or_insert(at);
            self.longest_unserved = self.longest_unserved.max(at.saturating_sub(since));
        } else {
            self.unserved_since = None;
        }
        if self.restoring.is_some() {
            if self.restored.is_none()
                && let Some(since) = self.streak.see(at, *answer == Answer::Primary)
            {
                self.restored = Some(since);
            }
            return;
        }
        if self.failed_over.is_some() {
            return;
        }
        let Answer::Other(region) = answer else {
            self.streak = Streak::default();
            return;
        };
        if self.region.as_ref() != Some(region) {
            self.streak = Streak::default();
            self.region = Some(region.clone());
        }
        if let Some(since) = self.streak.see(at, true) {
            self.failed_over = Some((since, region.clone()));
        }
    }

    /// The faults were removed at `at`: from now on the primary is
    /// awaited.
    pub fn restoring(&mut self, at: Duration) {
        if self.restoring.is_none() {
            self.restoring = Some(at);
            self.streak = Streak::default();
        }
    }

    /// The outage to the sustained failover.
    pub fn rto(&self) -> Option<Duration> {
        let (since, _) = self.failed_over.as_ref()?;
        Some(since.saturating_sub(self.outage?))
    }

    /// The faults' removal to the primary serving again, sustained.
    pub fn failback(&self) -> Option<Duration> {
        Some(self.restored?.saturating_sub(self.restoring?))
    }

    /// How long buyers have gone without a failover at `now`: `None`
    /// before the outage and once failed over.
    pub fn unserved_for(&self, now: Duration) -> Option<Duration> {
        match (self.outage, &self.failed_over) {
            (Some(outage), None) => Some(now.saturating_sub(outage)),
            _ => None,
        }
    }
}

/// The buyer's orders: the tally, and the timeline of the orders taken as
/// answers ([`Fate::answer`]), so the failover is dated on orders too.
#[derive(Debug, Clone, Default)]
pub struct Orders {
    /// Who acknowledged, refused or never answered what.
    pub tally: Tally,
    /// The orders on a timeline: served when acknowledged.
    pub timeline: Timeline,
}

/// Whose orders a run's buyer places, to look them up in the regions'
/// databases.
#[derive(Debug, Clone)]
pub struct Buyers {
    /// The primary sale's region.
    pub primary: String,
    /// The sale's id, the `sale` of its orders' rows.
    pub sale_id: String,
    /// The prefix of every buyer id of the run.
    pub prefix: String,
}

/// Asks the endpoint which region answers, and orders through it as the
/// run's buyer (and at the standby's gateways directly, when given), until
/// dropped: into a [`Timeline`] and [`Orders`] it shares.
pub struct Probe {
    buyers: Buyers,
    timeline: Arc<Mutex<Timeline>>,
    orders: Arc<Mutex<Orders>>,
    direct: Option<Arc<Mutex<Orders>>>,
    settling: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Probe {
    /// Starts asking `url`'s `/`, judging answers against `primary`, the
    /// primary sale's region, and ordering through `url` with `signer`'s
    /// tokens, and at `direct` (the standby's gateways) too when given.
    pub fn start(
        (url, direct): (String, Option<String>),
        primary: String,
        signer: Signer,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let timeline = Arc::new(Mutex::new(Timeline::default()));
        let settling = Arc::new(AtomicBool::new(false));
        let answers = {
            let (url, timeline, primary) = (url.clone(), timeline.clone(), primary.clone());
            paced(
                (PROBE_EVERY, settling.clone()),
                clock.clone(),
                move |_| {
                    let url = url.clone();
                    async move { standby::answering_region(&url, "/", PROBE_TIMEOUT).await }
                },
                move |sent, answer, took| {
                    lock(&timeline).see(sent, &Answer::of(answer.ok(), &primary), took);
                },
            )
        };
        let buyers = Buyers {
            primary: primary.clone(),
            sale_id: signer.buyers().0.to_owned(),
            prefix: signer.buyers().1,
        };
        let (signer, mut tasks) = (Arc::new(signer), vec![answers]);
        let mut lane = |url: String, lane: &'static str| {
            let orders = Arc::new(Mutex::new(Orders::default()));
            let buyer = Buyer {
                url,
                lane,
                primary: primary.clone(),
                signer: signer.clone(),
            };
            tasks.push(buyer.start(orders.clone(), settling.clone(), clock.clone()));
            orders
        };
        let orders = lane(url, "");
        let direct = direct.map(|url| lane(url, crate::buyer::DIRECT_LANE));
        Self {
            buyers,
            timeline,
            orders,
            direct,
            settling,
            tasks,
        }
    }

    /// Stops asking and waits for the answers still awaited (each within
    /// its bound): the buyer's orders as finally answered, so none it
    /// placed is left out of the tally.
    pub async fn settle(&mut self) -> Orders {
        self.settling.store(true, Ordering::Relaxed);
        for task in &mut self.tasks {
            // Each answer is bounded, so the wait is too; a task that ended
            // otherwise has nothing left to wait for.
            let _ = tokio::time::timeout(PROBE_TIMEOUT * 2, task).await;
        }
        self.orders()
    }

    /// Whose orders the buyer places.
    pub const fn buyers(&self) -> &Buyers {
        &self.buyers
    }

    /// The timeline so far.
    pub fn timeline(&self) -> Timeline {
        lock(&self.timeline).clone()
    }

    /// The buyer's orders through the endpoint so far.
    pub fn orders(&self) -> Orders {
        lock(&self.orders).clone()
    }

    /// The buyer's orders at the standby's gateways so far, when it
    /// orders there.
    pub fn direct_orders(&self) -> Option<Orders> {
        self.direct.as_ref().map(|orders| lock(orders).clone())
    }

    /// Marks the faults removed at `at`.
    pub fn restoring(&self, at: Duration) {
        lock(&self.timeline).restoring(at);
        lock(&self.orders).timeline.restoring(at);
        if let Some(direct) = &self.direct {
            lock(direct).timeline.restoring(at);
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// One lane of the run's buyer: orders at `url`, as buyers of `lane`.
struct Buyer {
    url: String,
    lane: &'static str,
    primary: String,
    signer: Arc<Signer>,
}

impl Buyer {
    /// Orders every [`ORDER_EVERY`] into `orders` until `settling`.
    fn start(
        self,
        orders: Arc<Mutex<Orders>>,
        settling: Arc<AtomicBool>,
        clock: Arc<dyn Clock>,
    ) -> tokio::task::JoinHandle<()> {
        let Self {
            url,
            lane,
            primary,
            signer,
        } = self;
        let wall = clock.clone();
        paced(
            (ORDER_EVERY, settling),
            clock,
            move |n| {
                let (url, signer, now) = (url.clone(), signer.clone(), wall.now());
                async move {
                    let (buyer, token) = match signer.sign((lane, n), now) {
                        Ok(signed) => signed,
                        Err(err) => {
                            tracing::warn!(error = %err, "cannot sign a drill order");
                            return Fate::Unanswered;
                        }
                    };
                    let order = (token.as_str(), flashsale_drill_buyer::SKU, buyer.as_str());
                    Fate::of(standby::place_order(&url, order, PROBE_TIMEOUT).await)
                }
            },
            move |sent, fate: Fate, took| {
                let mut orders = lock(&orders);
                orders.timeline.see(sent, &fate.answer(&primary), took);
                orders.tally.see(fate);
            },
        )
    }
}

/// Asks `ask(n)` for the `n`th time every `every` on schedule, whatever
/// earlier answers take, as buyers arrive (at most [`PROBE_TIMEOUT`] /
/// `every` in flight), and hands each answer to `take` in the order asked,
/// which the timeline's runs count on: dated when asked (what the buyer
/// saw at that moment), with how long it took. Until aborted, or until
/// `settling` is set and every answer asked before it was taken.
fn paced<A, F>(
    (every, settling): (Duration, Arc<AtomicBool>),
    clock: Arc<dyn Clock>,
    mut ask: impl FnMut(u64) -> F + Send + 'static,
    mut take: impl FnMut(Duration, A, Duration) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = A> + Send + 'static,
    A: Send + 'static,
{
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut asked = FuturesOrdered::new();
        let mut n = 0;
        loop {
            let settled = settling.load(Ordering::Relaxed);
            if settled && asked.is_empty() {
                return;
            }
            tokio::select! {
                _ = ticks.tick(), if !settled => {
                    n += 1;
                    let (answer, clock) = (ask(n), clock.clone());
                    asked.push_back(async move {
                        let sent = clock.monotonic();
                        let answer = answer.await;
                        (sent, answer, clock.monotonic().saturating_sub(sent))
                    });
                }
                Some((sent, answer, took)) = asked.next(), if !asked.is_empty() => {
                    take(sent, answer, took);
                }
            }
        }
    })
}

fn lock<T>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn feed(timeline: &mut Timeline, from: u64, answers: &[Answer]) {
        for (i, answer) in answers.iter().enumerate() {
            timeline.see(ms(from + 100 * i as u64), answer, ms(20));
        }
    }

    fn b() -> Answer {
        Answer::Other("b".into())
    }

    #[test]
    fn answers_are_served_only_by_a_gateway_below_500() {
        assert_eq!(
            Answer::of(Some((404, Some("a".into()))), "a"),
            Answer::Primary
        );
        assert_eq!(Answer::of(Some((200, Some("b".into()))), "a"), b());
        assert_eq!(
            Answer::of(Some((503, Some("b".into()))), "a"),
            Answer::Unserved
        );
        assert_eq!(Answer::of(Some((503, None)), "a"), Answer::Unserved);
        assert_eq!(Answer::of(Some((200, None)), "a"), Answer::Unserved);
        assert_eq!(Answer::of(None, "a"), Answer::Unserved);
    }

    #[test]
    fn the_rto_runs_from_the_first_unserved_answer_to_the_first_of_a_sustained_run() {
        use Answer::{Primary, Unserved};
        let mut timeline = Timeline::default();
        // A serves, then nothing at 300 ms, one early answer of B that
        // does not last, then B for good from 1000 ms.
        feed(
            &mut timeline,
            0,
            &[Primary, Primary, Primary, Unserved, Unserved, b(), Unserved],
        );
        assert_eq!(timeline.unserved_for(ms(700)), Some(ms(400)));
        feed(&mut timeline, 700, &[Unserved, Unserved, Unserved]);
        feed(&mut timeline, 1000, &[b(), b(), b(), b()]);
        assert_eq!(timeline.rto(), None, "four answers are not sustained");
        feed(&mut timeline, 1400, &[b()]);
        assert_eq!(timeline.failed_over, Some((ms(1000), "b".into())));
        assert_eq!(timeline.rto(), Some(ms(700)));
        assert_eq!(timeline.unserved_for(ms(5000)), None);
        // 300 to 900 ms, the 500 ms run of B aside.
        assert_eq!(timeline.longest_unserved, ms(300));
    }

    #[test]
    fn a_primary_that_drains_before_the_switch_costs_buyers_nothing() {
        let mut timeline = Timeline::default();
        // A serves until the endpoint moved buyers to B: never unserved.
        feed(
            &mut timeline,
            0,
            &[Answer::Primary, Answer::Primary, b(), b(), b(), b(), b()],
        );
        assert_eq!(timeline.outage, Some(ms(200)));
        assert_eq!(timeline.rto(), Some(Duration::ZERO));
        assert_eq!(timeline.longest_unserved, Duration::ZERO);
        assert_eq!(timeline.slowest, ms(20));
    }

    #[test]
    fn an_answer_held_and_handed_over_is_served_late() {
        let mut timeline = Timeline::default();
        timeline.see(ms(0), &Answer::Primary, ms(900));
        timeline.see(ms(100), &Answer::Unserved, ms(2000));
        timeline.see(ms(200), &b(), ms(1100));
        feed(&mut timeline, 300, &[b(), b(), b(), b()]);
        assert_eq!(timeline.rto(), Some(ms(100)));
        assert_eq!(
            timeline.slowest,
            ms(1100),
            "unserved, or before the outage: not counted"
        );
        timeline.restoring(ms(700));
        timeline.see(ms(700), &Answer::Primary, ms(1500));
        assert_eq!(
            timeline.slowest,
            ms(1100),
            "after the faults' removal: not counted"
        );
    }

    #[test]
    fn a_switch_between_two_other_regions_starts_the_run_again() {
        let mut timeline = Timeline::default();
        let c = Answer::Other("c".into());
        feed(
            &mut timeline,
            0,
            &[Answer::Unserved, b(), b(), b(), c.clone()],
        );
        feed(&mut timeline, 500, &[c.clone(), c.clone(), c.clone(), c]);
        assert_eq!(timeline.failed_over, Some((ms(400), "c".into())));
    }

    #[test]
    fn the_failback_counts_only_answers_from_the_primary_after_the_faults_went() {
        use Answer::{Primary, Unserved};
        let mut timeline = Timeline::default();
        feed(&mut timeline, 0, &[Unserved, b(), b(), b(), b(), b()]);
        timeline.restoring(ms(600));
        // B still serves, A blinks once, then holds from 1200 ms.
        feed(
            &mut timeline,
            600,
            &[b(), b(), Primary, Unserved, b(), b(), Primary, Primary],
        );
        assert_eq!(timeline.failback(), None);
        feed(&mut timeline, 1400, &[Primary, Primary, Primary]);
        assert_eq!(timeline.restored, Some(ms(1200)));
        assert_eq!(timeline.failback(), Some(ms(600)));
        assert_eq!(timeline.rto(), Some(ms(100)));
    }

    #[test]
    fn a_primary_that_never_failed_has_no_outage_and_no_rto() {
        let mut timeline = Timeline::default();
        feed(&mut timeline, 0, &vec![Answer::Primary; 10]);
        assert_eq!(timeline.outage, None);
        assert_eq!(timeline.unserved_for(ms(9000)), None);
        assert_eq!(timeline.rto(), None);
    }
}
