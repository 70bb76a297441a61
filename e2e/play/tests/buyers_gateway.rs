//! Buyers against a real gateway: the gateway and the inventory in this
//! process, on the local stack's Redis and Kafka (the funnel the gateway's
//! benchmark runs against). What the buyers' ledger says was acknowledged
//! and paid must be exactly what the gateway published, and the stock must
//! add up.

use std::{collections::BTreeSet, time::Duration};

use flashsale_bench::funnel::{Funnel, Options};
use flashsale_e2e::funnel::{JWT_SECRET, PAYMENT_SECRET};
use flashsale_orders::EventKind;
use flashsale_play::buyers::{self, Config, Counters, Outcome, Profile, Progress, SkuLimit};
use serde_json::json;

/// Plays `users` buyers against `funnel` for `play`.
async fn play(funnel: &Funnel, users: usize, play: Duration) -> anyhow::Result<Outcome> {
    let config = Config {
        gateway: funnel.gateway.url.clone(),
        jwt_secret: JWT_SECRET.to_vec(),
        payment_secret: PAYMENT_SECRET.to_vec(),
        skus: ["A", "B"]
            .into_iter()
            .map(|sku| SkuLimit {
                sku: sku.to_owned(),
                limit: 2,
            })
            .collect(),
        users,
        profile: Profile::constant(1.0)?,
        think: Duration::from_millis(100),
        abandon: 0.3,
        purchase_share: 0.7,
        seed: 7,
        http_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let counters = Counters::default();
    let watched = counters.clone();
    let stop = async move {
        tokio::time::sleep(play).await;
        // Every buyer was playing when the stop came.
        assert_eq!(watched.active() as usize, users);
    };
    Ok(buyers::run(config, Progress::hidden(), counters, stop).await?)
}

/// The order ids of the topic's events of `kind`.
async fn published(funnel: &Funnel, kind: EventKind) -> anyhow::Result<BTreeSet<String>> {
    Ok(funnel
        .events()
        .await?
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.order_id)
        .collect())
}

/// The checks every run must pass: the ledger is what was published, the
/// counts agree with it, and no acknowledged unit is missing from stock.
async fn check(funnel: &Funnel, outcome: &Outcome, stock: u64) -> anyhow::Result<()> {
    let (tally, ledger) = (&outcome.tally, &outcome.ledger);
    eprintln!("tally: {}", serde_json::to_string(tally)?);
    assert_eq!(
        ledger.order_ids(),
        published(funnel, EventKind::Created).await?
    );
    assert_eq!(
        ledger.paid_order_ids(),
        published(funnel, EventKind::Paid).await?
    );
    assert_eq!(ledger.unresolved().count(), 0, "{ledger:?}");
    assert_eq!(tally.acknowledged as usize, ledger.order_ids().len());
    assert_eq!(tally.paid as usize, ledger.paid_order_ids().len());
    assert_eq!(
        tally.acknowledged,
        tally.paid + tally.abandoned + tally.payment_failed,
        "{tally:?}"
    );
    assert_eq!(tally.errors(), 0, "{tally:?}");
    let units = ledger.units_acknowledged();
    for sku in ["A", "B"] {
        let sold = units.get(sku).copied().unwrap_or(0);
        assert_eq!(
            sold + funnel.available(sku).await?,
            stock,
            "{sku}: {units:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buyers_buy_out_the_stock_and_their_ledger_is_what_was_published() -> anyhow::Result<()> {
    let stock = 15;
    let funnel = Funnel::start(Options {
        stock,
        per_user_limit: 2,
        ..Options::default()
    })
    .await?;
    // 12 buyers may buy 2 of each SKU: 48 units wanted, 30 for sale.
    let outcome = play(&funnel, 12, Duration::from_secs(5)).await?;
    let tally = &outcome.tally;
    assert_eq!(tally.arrived, 12);
    assert_eq!(outcome.ledger.buyers.len(), 12);
    check(&funnel, &outcome, stock).await?;
    // Everything sold, and the buyers were told so.
    assert_eq!(
        outcome
            .ledger
            .units_acknowledged()
            .into_values()
            .sum::<u64>(),
        2 * stock,
        "{tally:?}"
    );
    assert!(tally.sold_out > 0, "{tally:?}");
    assert!(tally.paid > 0 && tally.abandoned > 0, "{tally:?}");
    assert!(tally.browses > 0, "{tally:?}");
    for buyer in &outcome.ledger.buyers {
        for sku in ["A", "B"] {
            let bought = buyer.orders.iter().filter(|o| o.sku == sku).count();
            assert!(bought <= 2, "{}: {bought} of {sku}", buyer.user);
        }
    }
    funnel.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buyers_queue_in_the_waiting_room_and_order_with_their_pass() -> anyhow::Result<()> {
    let stock = 50;
    let funnel = Funnel::start(Options {
        stock,
        per_user_limit: 2,
        config: json!({"waitingRoom": {"enabled": true, "admitPerSecond": 100, "passTtlSeconds": 60}}),
        ..Options::default()
    })
    .await?;
    // The first poll comes 2-3 s after joining.
    let outcome = play(&funnel, 6, Duration::from_secs(7)).await?;
    let tally = &outcome.tally;
    check(&funnel, &outcome, stock).await?;
    assert_eq!(tally.queued, 6, "{tally:?}");
    assert!(tally.acknowledged > 0, "{tally:?}");
    assert!(tally.admitted >= tally.acknowledged, "{tally:?}");
    // A place in the queue buys once: the ticket's place is then used up.
    for buyer in &outcome.ledger.buyers {
        assert!(buyer.orders.len() <= 1, "{buyer:?}");
    }
    funnel.cleanup().await
}
