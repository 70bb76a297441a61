//! Virtual waiting room: when a sale turns it on, users queue for the right
//! to order and are let in strictly in arrival order at a fixed rate, across
//! all gateway replicas.
//!
//! # Flow
//!
//! 1. [`WaitingRoom::join`] gives a user a position and a signed **ticket**
//!    (the handler answers 202, ticket in a cookie and in the JSON body).
//!    Joining again returns the same position and the same ticket.
//! 2. [`WaitingRoom::status`] (`GET /api/v1/queue/status`) checks the ticket
//!    against the caller's user and answers the position, how many wait
//!    ahead, the estimated wait and when to poll next (`poll_base` + uniform
//!    `[0, poll_jitter)`, so clients that joined together do not poll
//!    together). Once admitted it also hands out a **pass**, valid for
//!    `pass_ttl`. It answers from the frontier this replica last read (see
//!    *Status from memory*), so polling costs Redis nothing.
//! 3. [`WaitingRoom::lease`] (`POST /orders`) redeems the pass **on lease**
//!    and returns a [`PassLease`]: the position is marked used for
//!    `lease_ttl` only (a little longer than an order may take).
//!    [`PassLease::commit`] makes the mark final once the order succeeded;
//!    [`PassLease::give_back`] (or dropping the lease undecided) makes the
//!    pass usable again, so a failure that is not the buyer's (a 503, the
//!    client gone, the gateway dead) does not cost them their turn. The
//!    same steps without the guard: [`WaitingRoom::redeem`],
//!    [`WaitingRoom::commit`], [`WaitingRoom::give_back`].
//!
//! # Tokens
//!
//! `base64url(payload) "." base64url(HMAC-SHA256(key, tag || payload))`,
//! unpadded, so they fit cookies and URLs. The payload is compact JSON with a
//! version: a ticket `{"v":1,"u":user,"s":sale,"p":position,"i":issued_at_ms}`,
//! a pass `{"v":1,"u":user,"s":sale,"p":position,"e":expires_at_ms}`. Tickets
//! and passes are MACed under different domain tags, so neither can stand in
//! for the other. The MAC is checked (in constant time) before the payload is
//! parsed, and before Redis is asked anything, so forgeries are cheap to turn
//! away. Refusals name their reason ([`Refusal::code`]): `malformed`,
//! `forged`, `wrong_kind`, `expired`, `other_user`, `other_sale`, `replayed`.
//!
//! # Redis keys (the sale's slot, `fs:{S}:`)
//!
//! | key | type | what |
//! |---|---|---|
//! | `fs:{S}:wr:seq` | int | last position handed out (INCR) |
//! | `fs:{S}:wr:frontier` | hash | `admitted` (every position up to it is in), `last_us` (Redis clock of the admission credit) |
//! | `fs:{S}:wr:user:<U>` | hash | user U's `position` and `issued_ms`; expires with the ticket |
//! | `fs:{S}:wr:used:<P>` | string | set while position P's pass is redeemed (value: the redemption's claim); lives `lease_ttl`, then `ticket_ttl + pass_ttl` from the commit |
//! | `fs:{S}:wr:spent:<N>` | string | set when the join challenge of nonce N is spent ([`crate::bot_shield`]): empty by a join, the order's request id by an order without a queue ([`OrderSpends`]); lives until the challenge expires |
//!
//! The counter and the frontier live as long as the sale's keys: positions
//! must never be handed out twice while tickets or used markers remain.
//!
//! # Admission
//!
//! Admission is a frontier, not a list: a user is admitted when their
//! position is at most `admitted`. The frontier moves by time alone: a script
//! (`admission.lua`) reads Redis `TIME`, turns the time since `last_us` into
//! credit (`elapsed × admit_per_second`), moves `admitted` by the whole
//! credits, never past `seq`, and moves `last_us` by exactly the time those
//! credits cost, so the fraction carries over. Guarantees:
//!
//! - **Strict order.** Positions come from one counter and the frontier only
//!   grows, so nobody is admitted before anyone who joined earlier.
//! - **Global, exact rate.** The credit is computed and spent inside one
//!   atomic script on the shared state, so any number of replicas may call
//!   [`WaitingRoom::advance`] (each every ~100 ms, and a status poll when
//!   the replica's reading is stale) without admitting the same second
//!   twice.
//! - **No burst after idle.** While nobody waits the frontier sits at `seq`;
//!   the first join after that restarts the credit clock, so credit is never
//!   hoarded. Should every replica stop advancing while users wait (all down),
//!   at most one second of credit is granted at once when one comes back.
//! - **No-shows do not stall the queue.** Since time, not users, moves the
//!   frontier, a user who stopped polling is passed over like anyone else.
//!   The trade-off, as in commercial queues: that admission slot is spent on
//!   them. If they come back while their ticket is valid they get their pass
//!   at once, so the order rate can briefly exceed the admission rate by the
//!   returning no-shows.
//!
//! # Status from memory
//!
//! Every call of the admission script leaves its reading (frontier, issued,
//! Redis clock) in the replica's memory. A status poll uses that reading
//! while it is at most `frontier_max_age` old (250 ms; the background
//! advance refreshes it every ~100 ms), with the Redis clock moved on by
//! the time since; otherwise the poll runs the script itself, one poll at a
//! time per replica, the others waiting for its reading. So a client polling
//! faster than its hint, or a million clients polling, cost no Redis call
//! per poll: a replica reads the frontier at most once per
//! `frontier_max_age` for all of them. A poll may see admission up to that
//! age late.
//!
//! # Passes are one-time, redeemed on lease
//!
//! Redeeming sets `used:<P>` with `SET NX PX lease_ttl`: a second redemption
//! of any pass of position P while it is set is `replayed`. Commit (the order
//! succeeded) extends the marker to `ticket_ttl + pass_ttl`: status hands out
//! a fresh pass on every poll while the ticket lives, so the marker outlives
//! any pass of P. Until the commit the marker only lives the lease, so a
//! gateway that dies mid-order frees the pass within seconds: the buyer
//! retries with it, or polls (or rejoins, which returns the same ticket) for
//! a fresh one. The marker holds a random claim; commit and give-back act
//! only on their own claim, so a stale or repeated give-back cannot reopen
//! someone's later redemption. A commit that finds the lease lapsed and the
//! marker free sets it again (the order stands); one that finds another
//! claim reports [`Error::LeaseLost`] (the order took longer than the
//! lease and the pass was redeemed again meanwhile). If Redis fails or
//! times out during a redemption, no order goes ahead and the claim is
//! given back in the background (and lapses with the lease anyway).
//!
//! # Clocks
//!
//! Redis `TIME` is the only clock: it stamps tickets (`issued_ms`), drives the
//! frontier, sets pass expiries (status reads it through the admission script,
//! moved on by at most `frontier_max_age` of the replica's monotonic clock)
//! and checks them (in the redeem script). Gateway replicas' wall clocks never
//! matter, so skew between them cannot admit early or expire passes wrongly.
//! A Redis failover to a server whose clock is off shifts lifetimes by that
//! offset (milliseconds with NTP); a clock stepping back restarts the
//! admission credit instead of stalling it.
//!
//! # When Redis is unavailable
//!
//! Calls fail with [`Error::Redis`] or [`Error::Timeout`] (the handler answers
//! 503), distinct from [`Error::Refused`] (403/401). Unlike the rate limit
//! there is no local fallback: a replica deciding alone could not keep the
//! order or the global rate.

mod known;
mod lease;
mod store;
mod token;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use flashsale_runtime::RedisConnection;

use known::Known;
pub use lease::PassLease;
use store::{Frontier, Redemption, Store};
pub use token::{Challenge, MAC_LEN, MAX_TOKEN_LEN, MIN_KEY_LEN, Pass, Refusal, Signer, Ticket};

/// Longest user id accepted, so every ticket stays under [`MAX_TOKEN_LEN`].
pub const MAX_USER_LEN: usize = 256;

/// Waiting-room settings of one sale.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The sale (its keys are `fs:{sale}:wr:…`).
    pub sale: String,
    /// Users admitted per second, across all replicas (0 counts as 1).
    pub admit_per_second: u32,
    /// How long a ticket (and so a queue position) is valid.
    pub ticket_ttl: Duration,
    /// How long a pass is valid after a status poll hands it out.
    pub pass_ttl: Duration,
    /// How long a redeemed pass stays used without a commit: a little longer
    /// than an order may take, so a gateway dying mid-order frees it soon.
    pub lease_ttl: Duration,
    /// How old this replica's reading of the frontier may be for a status
    /// poll to use it instead of asking Redis.
    pub frontier_max_age: Duration,
    /// Shortest time between two status polls of a client.
    pub poll_base: Duration,
    /// Random extra time on top of `poll_base`, uniform in `[0, poll_jitter)`.
    pub poll_jitter: Duration,
    /// Longest wait for one Redis call.
    pub redis_timeout: Duration,
}

impl Settings {
    /// Defaults for `sale` admitting `admit_per_second`: tickets for 1 h,
    /// passes for 5 min, leases for 5 s (the default 2 s order budget and
    /// room to spare), status from a reading up to 250 ms old, polls every
    /// 2 s + up to 1 s, Redis calls bounded by 100 ms.
    pub fn new(sale: impl Into<String>, admit_per_second: u32) -> Self {
        Self {
            sale: sale.into(),
            admit_per_second,
            ticket_ttl: Duration::from_secs(3_600),
            pass_ttl: Duration::from_secs(300),
            lease_ttl: Duration::from_secs(5),
            frontier_max_age: Duration::from_millis(250),
            poll_base: Duration::from_secs(2),
            poll_jitter: Duration::from_secs(1),
            redis_timeout: REDIS_TIMEOUT,
        }
    }
}

/// Why the waiting room could not answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ticket or pass is refused (a client error: 401/403).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Redis failed or is unreachable (503).
    #[error("waiting room: redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis did not answer within the configured timeout (503).
    #[error("waiting room: Redis did not answer in time")]
    Timeout,
    /// The signing key is too short (a configuration error).
    #[error("the waiting-room signing key has {0} bytes; at least {MIN_KEY_LEN} are needed")]
    WeakKey(usize),
    /// The user id is empty or longer than [`MAX_USER_LEN`] bytes.
    #[error("a user id must have 1 to {MAX_USER_LEN} bytes, not {0}")]
    InvalidUser(usize),
    /// A commit found the pass redeemed again by someone else: the lease
    /// lapsed before the order was done.
    #[error("waiting room: the pass's lease lapsed and it was redeemed again")]
    LeaseLost,
    /// A commit's task did not finish (the runtime is shutting down).
    #[error("waiting room: the commit was interrupted")]
    Interrupted,
}

/// A join challenge, spent by the join it opened (or, without a waiting
/// room, by an order): its nonce, and its expiry on the Redis clock
/// ([`crate::bot_shield`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spend {
    /// The challenge's nonce: its spent marker's name.
    pub nonce: u64,
    /// When the challenge expires (Unix ms, Redis clock).
    pub expires_at_ms: u64,
}

/// The default longest wait for one Redis call: a queue, a join or a spend
/// is on a buyer's path.
const REDIS_TIMEOUT: Duration = Duration::from_millis(100);

/// Spends the join challenges of orders placed where the sale has no
/// waiting room ([`crate::bot_shield`]): each order spends one, under the
/// sale's waiting-room keys but with no queue. Cheap to clone.
#[derive(Clone)]
pub struct OrderSpends {
    store: Store,
}

impl OrderSpends {
    /// Spends in `redis` for `sale`, each call bounded as the waiting
    /// room's are by default.
    pub fn new(redis: RedisConnection, sale: &str) -> Self {
        Self {
            store: Store::new(redis, sale, REDIS_TIMEOUT),
        }
    }

    /// Spends `spend` for the order of `request_id`, which a retry of that
    /// order may do again: a challenge spent by another order is
    /// `replayed`, one past its expiry `expired`, both without a write.
    pub async fn spend(&self, spend: Spend, request_id: &str) -> Result<(), Error> {
        self.store.spend(spend, request_id).await
    }
}

/// A user's place after joining.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    /// The signed ticket (cookie and JSON body).
    pub ticket: String,
    /// Place in the queue, from 1.
    pub position: u64,
    /// Users ahead who are not admitted yet.
    pub ahead: u64,
    /// Until the frontier reaches this position, at the admission rate.
    pub estimated_wait: Duration,
    /// When the client should poll the status.
    pub next_poll: Duration,
}

/// A ticket holder's place now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Place in the queue, from 1.
    pub position: u64,
    /// Users ahead who are not admitted yet (0 when admitted).
    pub ahead: u64,
    /// Until admission (zero when admitted).
    pub estimated_wait: Duration,
    /// When the client should poll again.
    pub next_poll: Duration,
    /// Whether the user may order now.
    pub admitted: bool,
    /// The pass `POST /orders` requires; `Some` when admitted.
    pub pass: Option<String>,
    /// When the pass expires (Unix ms, Redis clock); `Some` when admitted.
    pub pass_expires_at_ms: Option<u64>,
}

/// A pass redeemed on lease; only [`WaitingRoom::redeem`] makes one,
/// [`WaitingRoom::commit`] makes it final and [`WaitingRoom::give_back`]
/// undoes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redeemed {
    /// The queue position the pass was for.
    pub position: u64,
    /// The random value the used marker holds for this redemption.
    claim: u64,
}

/// The queue's size after an advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Depth {
    /// Positions handed out.
    pub issued: u64,
    /// Positions admitted.
    pub admitted: u64,
}

impl Depth {
    /// Users still waiting (`gateway_waiting_room_depth`).
    pub fn waiting(&self) -> u64 {
        self.issued.saturating_sub(self.admitted)
    }
}

/// One sale's waiting room over Redis; cheap to clone (clones share the
/// frontier reading).
#[derive(Clone)]
pub struct WaitingRoom {
    store: Store,
    signer: Arc<Signer>,
    settings: Arc<Settings>,
    /// The last frontier read, for status polls.
    known: Arc<Mutex<Option<Known>>>,
    /// Held while a status poll reads the frontier, so a stale reading
    /// costs one Redis call, not one per waiting poll.
    reading: Arc<tokio::sync::Mutex<()>>,
}

impl WaitingRoom {
    /// A waiting room for `settings.sale`, signing with `signer` (every
    /// replica of the sale needs the same key).
    pub fn new(redis: RedisConnection, signer: Signer, settings: Settings) -> Self {
        Self {
            store: Store::new(redis, &settings.sale, settings.redis_timeout),
            signer: Arc::new(signer),
            settings: Arc::new(settings),
            known: Arc::default(),
            reading: Arc::default(),
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The signer of the room's tokens, which also signs its join
    /// challenges.
    pub(crate) fn signer(&self) -> Arc<Signer> {
        Arc::clone(&self.signer)
    }

    fn rate(&self) -> u32 {
        self.settings.admit_per_second.max(1)
    }

    /// Queues `user`, or returns their place and the same ticket if they
    /// already hold one.
    pub async fn join(&self, user: &str) -> Result<Joined, Error> {
        self.join_spending(user, None).await
    }

    /// Queues `user` as [`WaitingRoom::join`] does, spending the join
    /// challenge `spend` in the same script call: one already spent is
    /// `replayed`, one past its expiry `expired`, both refused before the
    /// script writes anything. A user who already holds a place gets it
    /// back and spends nothing.
    pub async fn join_spending(&self, user: &str, spend: Option<Spend>) -> Result<Joined, Error> {
        if user.is_empty() || user.len() > MAX_USER_LEN {
            return Err(Error::InvalidUser(user.len()));
        }
        let place = self
            .store
            .join(user, self.settings.ticket_ttl, spend)
            .await?;
        let ticket = self.signer.sign_ticket(&Ticket {
            user: user.to_owned(),
            sale: self.settings.sale.clone(),
            position: place.position,
            issued_at_ms: place.issued_at_ms,
        });
        Ok(Joined {
            ticket,
            position: place.position,
            ahead: ahead(place.position, place.admitted),
            estimated_wait: estimated_wait(place.position, place.admitted, self.rate()),
            next_poll: self.next_poll(),
        })
    }

    /// The place of `ticket`'s holder, with a pass once admitted. `user` is
    /// the caller's authenticated user: it must be the ticket's. Answered
    /// from this replica's recent reading of the frontier when there is one.
    pub async fn status(&self, ticket: &str, user: &str) -> Result<Status, Error> {
        let ticket = self
            .signer
            .open_ticket(ticket, &self.settings.sale, Some(user))?;
        let frontier = self.frontier().await?;
        let now_ms = frontier.now_us / 1_000;
        ticket.check_fresh(self.settings.ticket_ttl, now_ms)?;
        let next_poll = self.next_poll();
        if ticket.position > frontier.admitted {
            return Ok(Status {
                position: ticket.position,
                ahead: ahead(ticket.position, frontier.admitted),
                estimated_wait: estimated_wait(ticket.position, frontier.admitted, self.rate()),
                next_poll,
                admitted: false,
                pass: None,
                pass_expires_at_ms: None,
            });
        }
        let expires_at_ms = now_ms.saturating_add(millis(self.settings.pass_ttl));
        let pass = self.signer.sign_pass(&Pass {
            user: ticket.user,
            sale: ticket.sale,
            position: ticket.position,
            expires_at_ms,
        });
        Ok(Status {
            position: ticket.position,
            ahead: 0,
            estimated_wait: Duration::ZERO,
            next_poll,
            admitted: true,
            pass: Some(pass),
            pass_expires_at_ms: Some(expires_at_ms),
        })
    }

    /// Redeems `pass` for `user`'s order on lease (`lease_ttl`); a pass (of
    /// any poll) for the same position is then `replayed` until the lease
    /// lapses or is given back, and for good once committed. Prefer
    /// [`WaitingRoom::lease`], which cannot forget to decide.
    pub async fn redeem(&self, pass: &str, user: &str) -> Result<Redeemed, Error> {
        let pass = self.signer.open_pass(pass, &self.settings.sale, user)?;
        let claim = rand::random::<u64>();
        let outcome = self
            .store
            .redeem(
                pass.position,
                pass.expires_at_ms,
                self.settings.lease_ttl,
                claim,
            )
            .await;
        match outcome {
            Ok(Redemption::Redeemed) => Ok(Redeemed {
                position: pass.position,
                claim,
            }),
            Ok(Redemption::Replayed) => Err(Refusal::Replayed.into()),
            Ok(Redemption::Expired) => Err(Refusal::Expired.into()),
            Err(err) => {
                // The SET may have happened without its answer reaching us;
                // no order follows, so the pass must stay usable.
                let store = self.store.clone();
                let position = pass.position;
                tokio::spawn(async move {
                    if let Err(err) = store.release(position, claim).await {
                        tracing::warn!(error = %err, position, "waiting room: pass not given back; its lease will lapse");
                    }
                });
                Err(err)
            }
        }
    }

    /// Redeems `pass` for `user`'s order on lease, as [`WaitingRoom::redeem`],
    /// in a guard that gives the pass back unless committed.
    pub async fn lease(&self, pass: &str, user: &str) -> Result<PassLease, Error> {
        let redeemed = self.redeem(pass, user).await?;
        Ok(PassLease::new(self.clone(), redeemed))
    }

    /// Makes a redemption final once its order succeeded: the pass stays
    /// spent for as long as any pass of its position could be valid.
    /// [`Error::LeaseLost`] if the lease lapsed and the position was
    /// redeemed again meanwhile.
    pub async fn commit(&self, redeemed: &Redeemed) -> Result<(), Error> {
        let marker_ttl = self
            .settings
            .ticket_ttl
            .saturating_add(self.settings.pass_ttl);
        match self
            .store
            .commit(redeemed.position, redeemed.claim, marker_ttl)
            .await?
        {
            true => Ok(()),
            false => Err(Error::LeaseLost),
        }
    }

    /// Makes a redeemed pass usable again, after the order failed for a
    /// reason that is not the buyer's. Does nothing if it was already given
    /// back (or its lease lapsed and someone else redeemed it).
    pub async fn give_back(&self, redeemed: &Redeemed) -> Result<(), Error> {
        self.store.release(redeemed.position, redeemed.claim).await
    }

    /// Moves the admission frontier by the time passed and returns the
    /// queue's size. Call it from every replica every ~100 ms; concurrent
    /// calls never admit more than the rate. Status polls answer from its
    /// reading.
    pub async fn advance(&self) -> Result<Depth, Error> {
        let frontier = self.read_frontier().await?;
        Ok(Depth {
            issued: frontier.issued,
            admitted: frontier.admitted,
        })
    }

    /// Runs the admission script and keeps its reading.
    async fn read_frontier(&self) -> Result<Frontier, Error> {
        let sent = Instant::now();
        let frontier = self.store.advance(self.rate()).await?;
        let fresh = Known::new(frontier, sent);
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.as_ref().is_none_or(|old| old.is_older_than(&fresh)) {
            *known = Some(fresh);
        }
        Ok(frontier)
    }

    /// The frontier now: the kept reading while it is recent, else a new
    /// one (one reader at a time; the others use its reading).
    async fn frontier(&self) -> Result<Frontier, Error> {
        if let Some(frontier) = self.recent() {
            return Ok(frontier);
        }
        let _reader = self.reading.lock().await;
        if let Some(frontier) = self.recent() {
            return Ok(frontier);
        }
        self.read_frontier().await
    }

    fn recent(&self) -> Option<Frontier> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known
            .as_ref()?
            .at(Instant::now(), self.settings.frontier_max_age)
    }

    fn next_poll(&self) -> Duration {
        next_poll(
            self.settings.poll_base,
            self.settings.poll_jitter,
            rand::random::<f64>(),
        )
    }
}

/// Users ahead of `position` not admitted yet, with the frontier at `admitted`.
fn ahead(position: u64, admitted: u64) -> u64 {
    position.saturating_sub(admitted).saturating_sub(1)
}

/// Time for the frontier to move from `admitted` to `position` at `rate`/s.
fn estimated_wait(position: u64, admitted: u64, rate: u32) -> Duration {
    let to_go = position.saturating_sub(admitted);
    Duration::from_micros(to_go.saturating_mul(1_000_000) / u64::from(rate.max(1)))
}

/// `base` plus `unit` (in `[0, 1)`) of `jitter`; integer nanoseconds, so no
/// setting can make the arithmetic panic.
fn next_poll(base: Duration, jitter: Duration, unit: f64) -> Duration {
    let jitter_ns = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
    let unit = if (0.0..1.0).contains(&unit) {
        unit
    } else {
        0.0
    };
    // `as` saturates; the product is below `jitter_ns` anyway.
    let extra_ns = (jitter_ns as f64 * unit) as u64;
    base.saturating_add(Duration::from_nanos(
        extra_ns.min(jitter_ns.saturating_sub(1)),
    ))
}

/// Whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
