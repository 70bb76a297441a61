//! One buyer: while active it thinks, then browses or buys; it keeps what
//! the gateway acknowledged to it.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use rand::{Rng, SeedableRng, rngs::StdRng};
use tokio::sync::watch;

use super::{
    Config, Error,
    answer::Answer,
    client::Gateway,
    ledger::BuyerLedger,
    tally::Count,
    token::{Bearer, Minter},
};

/// Page loads in a row of an impatient buyer: more than the per-user
/// burst a sale usually allows.
const IMPATIENT_RELOADS: usize = 8;

/// Longest think time, in means: the exponential tail is cut so no buyer
/// sleeps through a whole phase.
const MAX_THINK_MEANS: f64 = 10.0;

/// What every buyer shares.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) gateway: Gateway,
    pub(crate) minter: Minter,
}

/// The crowd's state, as the run publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Control {
    /// Buyers `0..active` are active.
    pub(crate) active: usize,
    /// The caller asked to stop.
    pub(crate) stopping: bool,
}

/// Where a page view goes.
enum Page {
    Item(String),
    Recommendations,
    History,
    Games,
}

impl Page {
    fn path(&self) -> String {
        match self {
            Page::Item(sku) => format!("/api/v1/items/{sku}"),
            Page::Recommendations => "/api/v1/recommendations".to_owned(),
            Page::History => "/api/v1/orders/history".to_owned(),
            Page::Games => "/api/v1/games".to_owned(),
        }
    }
}

/// One buyer and what it knows.
pub(crate) struct Buyer {
    pub(super) index: usize,
    pub(super) shared: Arc<Shared>,
    control: watch::Receiver<Control>,
    pub(super) rng: StdRng,
    bearer: Option<Bearer>,
    pub(super) ledger: BuyerLedger,
    /// Units acknowledged per SKU.
    pub(super) bought: BTreeMap<String, u64>,
    /// SKUs last seen sold out (until a page shows them available again:
    /// lapsed reservations return stock).
    pub(super) sold_out: BTreeSet<String>,
    /// SKUs the gateway said this buyer may buy no more of.
    pub(super) limit_reached: BTreeSet<String>,
    /// The gateway said the sale has ended.
    pub(super) sale_over: bool,
    /// The waiting room queued this buyer at least once.
    pub(super) was_queued: bool,
    /// The waiting room let this buyer through at least once.
    pub(super) was_admitted: bool,
}

impl Buyer {
    pub(crate) fn new(
        index: usize,
        shared: Arc<Shared>,
        control: watch::Receiver<Control>,
    ) -> Self {
        let seed = shared.config.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Self {
            index,
            control,
            rng: StdRng::seed_from_u64(seed),
            bearer: None,
            ledger: BuyerLedger {
                user: format!("buyer-{index}"),
                ..BuyerLedger::default()
            },
            bought: BTreeMap::new(),
            sold_out: BTreeSet::new(),
            limit_reached: BTreeSet::new(),
            sale_over: false,
            was_queued: false,
            was_admitted: false,
            shared,
        }
    }

    /// Plays until the run stops; returns the buyer's ledger.
    pub(crate) async fn play(mut self) -> Result<BuyerLedger, Error> {
        let counters = self.shared.gateway.counters().clone();
        loop {
            let index = self.index;
            let woken = self
                .control
                .wait_for(|c| c.stopping || index < c.active)
                .await
                .map(|c| c.stopping);
            // A dropped sender is a stop too.
            if woken.unwrap_or(true) {
                break;
            }
            counters.activated();
            let played = self.while_active().await;
            counters.deactivated();
            played?;
        }
        Ok(self.ledger)
    }

    async fn while_active(&mut self) -> Result<(), Error> {
        loop {
            let think = self.think_time();
            if self.pause(think).await {
                return Ok(());
            }
            let buy = self.rng.random::<f64>() < self.shared.config.purchase_share;
            match self.pick_sku().filter(|_| buy) {
                Some(sku) => self.purchase(&sku).await?,
                None => self.browse().await?,
            }
        }
    }

    /// Stopped, or no longer among the active buyers.
    pub(super) fn winding_down(&self) -> bool {
        let control = self.control.borrow();
        control.stopping || self.index >= control.active
    }

    /// Waits `wait` unless the buyer winds down first; true if it did.
    pub(super) async fn pause(&mut self, wait: Duration) -> bool {
        let index = self.index;
        tokio::select! {
            () = tokio::time::sleep(wait) => false,
            _ = self.control.wait_for(|c| c.stopping || index >= c.active) => true,
        }
    }

    /// `wait` plus up to 20% of it, so buyers told the same wait spread out.
    pub(super) fn jitter(&mut self, wait: Duration) -> Duration {
        wait + wait.mul_f64(self.rng.random::<f64>() * 0.2)
    }

    /// An exponentially distributed think time.
    fn think_time(&mut self) -> Duration {
        let mean = self.shared.config.think.as_secs_f64();
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let u: f64 = self.rng.random();
        Duration::from_secs_f64((-mean * (1.0 - u).ln()).min(mean * MAX_THINK_MEANS))
    }

    /// A SKU this buyer may still buy, at random.
    fn pick_sku(&mut self) -> Option<String> {
        if self.sale_over {
            return None;
        }
        let open: Vec<&str> = self
            .shared
            .config
            .skus
            .iter()
            .filter(|s| {
                self.bought.get(&s.sku).copied().unwrap_or(0) < s.limit
                    && !self.sold_out.contains(&s.sku)
                    && !self.limit_reached.contains(&s.sku)
            })
            .map(|s| s.sku.as_str())
            .collect();
        if open.is_empty() {
            return None;
        }
        let pick = self.rng.random_range(0..open.len());
        open.get(pick).map(|s| (*s).to_owned())
    }

    /// The buyer's bearer token, minted anew when close to expiry.
    pub(super) fn token(&mut self) -> Result<String, Error> {
        let now = jiff::Timestamp::now().as_second();
        match &self.bearer {
            Some(bearer) if !bearer.stale_at(now) => Ok(bearer.value.clone()),
            _ => {
                let bearer = self.shared.minter.mint(&self.ledger.user, now)?;
                let value = bearer.value.clone();
                self.bearer = Some(bearer);
                Ok(value)
            }
        }
    }

    /// One page view.
    async fn browse(&mut self) -> Result<(), Error> {
        self.shared.gateway.counters().add(Count::Browse);
        let skus = &self.shared.config.skus;
        let item = skus.get(self.rng.random_range(0..skus.len().max(1)));
        let page = match (self.rng.random_range(0..8), item) {
            (0..4, Some(item)) => Page::Item(item.sku.clone()),
            (0..6, _) => Page::Recommendations,
            (6, _) => Page::History,
            _ => Page::Games,
        };
        // An impatient buyer reloads the page again and again, faster than
        // the per-user rate limit allows: the limit's 429s come from these.
        let loads = if self.rng.random::<f64>() < self.shared.config.impatient {
            IMPATIENT_RELOADS
        } else {
            1
        };
        for _ in 0..loads {
            let token = self.token()?;
            let request = self.shared.gateway.get(&page.path()).bearer_auth(token);
            let answer = self.shared.gateway.send(request).await;
            if let (Page::Item(sku), Some(answer)) = (&page, &answer) {
                self.saw_item(sku, answer);
            }
            if answer.as_ref().is_some_and(unexpected) {
                self.shared.gateway.counters().add(Count::Unexpected);
            }
        }
        Ok(())
    }

    /// What an item page says about its stock.
    fn saw_item(&mut self, sku: &str, answer: &Answer) {
        match answer.text("status") {
            Some("sold_out") if answer.status == 200 => {
                self.sold_out.insert(sku.to_owned());
            }
            Some("available") if answer.status == 200 => {
                self.sold_out.remove(sku);
            }
            _ => {}
        }
    }
}

/// A client error no step expects (429 is the gateway shedding load).
pub(super) fn unexpected(answer: &Answer) -> bool {
    (400..500).contains(&answer.status) && answer.status != 429
}
