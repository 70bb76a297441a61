//! The crowd: activates buyers as the profile says, stops them when asked,
//! and gathers what they did.

use std::{future::Future, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use tokio::{sync::watch, task::JoinSet, time::Instant};

use super::{
    Config, Counters, Error, Ledger, Progress, Tally,
    buyer::{Buyer, Control, Shared},
    client::Gateway,
    tally::Count,
    token::Minter,
};

/// How often the active share is recomputed.
const TICK: Duration = Duration::from_millis(100);

/// What a run left: the final counts and every buyer's ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The counts when every buyer had ended.
    pub tally: Tally,
    /// What the gateway acknowledged, per buyer.
    pub ledger: Ledger,
}

/// Plays `config.users` buyers against the gateway along `config.profile`
/// until `stop` resolves, then lets every buyer finish the purchase it is
/// in and returns what they did. `counters` can be read while it runs
/// (clone it first); `progress` shows them.
pub async fn run(
    config: Config,
    progress: Progress,
    counters: Counters,
    stop: impl Future<Output = ()> + Send,
) -> Result<Outcome, Error> {
    config.check()?;
    let gateway = Gateway::new(config.base_url(), config.http_timeout, counters.clone())?;
    let minter = Minter::new(&config.jwt_secret)?;
    let (users, profile) = (config.users, config.profile.clone());
    let shared = Arc::new(Shared {
        config,
        gateway,
        minter,
    });
    let (control, watching) = watch::channel(Control {
        active: 0,
        stopping: false,
    });
    let following = progress.follow(counters.clone());
    let started = Instant::now();
    let mut buyers = JoinSet::new();
    let mut arrived = 0;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = tick.tick() => {
                let active = profile.active_at(started.elapsed(), users);
                control.send_if_modified(|c| std::mem::replace(&mut c.active, active) != active);
                // A buyer arrives at its first activation.
                while arrived < active {
                    let index = arrived;
                    arrived += 1;
                    counters.add(Count::Arrived);
                    let buyer = Buyer::new(index, shared.clone(), watching.clone());
                    buyers.spawn(async move { (index, buyer.play().await) });
                }
            }
        }
    }
    control.send_modify(|c| c.stopping = true);
    let mut ledgers = Vec::with_capacity(arrived);
    let mut failure = None;
    while let Some(joined) = buyers.join_next().await {
        match joined {
            Ok((index, Ok(ledger))) => ledgers.push((index, ledger)),
            Ok((_, Err(err))) => failure = failure.or(Some(err)),
            Err(err) => failure = failure.or(Some(Error::Buyer(err))),
        }
    }
    drop(following);
    let tally = counters.tally();
    progress.finish(&tally);
    if let Some(err) = failure {
        return Err(err);
    }
    ledgers.sort_by_key(|(index, _)| *index);
    Ok(Outcome {
        tally,
        ledger: Ledger {
            buyers: ledgers.into_iter().map(|(_, ledger)| ledger).collect(),
        },
    })
}
