//! The buyers' pure parts through the public API: the load profile, the
//! ledger's helpers and the serialised outcome.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use flashsale_play::buyers::{
    BuyerLedger, LOW_SHARE, Ledger, OrderRecord, Outcome, Phase, Profile, ProfileError, Tally,
    Unresolved,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn the_sale_profile_warms_ramps_holds_and_tails_over_its_total() {
    let profile = Profile::sale(secs(100));
    assert_eq!(profile.total(), secs(100));
    let starts: Vec<(Duration, &str)> = profile
        .starts()
        .into_iter()
        .map(|(at, phase)| (at, phase.name.as_str()))
        .collect();
    assert_eq!(
        starts,
        [
            (secs(0), "warm"),
            (secs(10), "ramp up"),
            (secs(30), "plateau"),
            (secs(70), "ramp down"),
            (secs(85), "tail"),
        ]
    );
    assert_eq!(profile.start_of("tail"), Some(secs(85)));
    assert_eq!(profile.start_of("encore"), None);
    for (at, share) in [
        (0, LOW_SHARE),
        (10, LOW_SHARE),
        (20, (LOW_SHARE + 1.0) / 2.0),
        (30, 1.0),
        (69, 1.0),
        (70, 1.0),
        (85, LOW_SHARE),
        (99, LOW_SHARE),
        // After the last phase the load holds at its end.
        (100, LOW_SHARE),
        (1000, LOW_SHARE),
    ] {
        let got = profile.share_at(secs(at));
        assert!(close(got, share), "at {at}s: {got} != {share}");
    }
    // Rounding leaves nothing out: the phases still add up to the total.
    assert_eq!(
        Profile::sale(Duration::from_millis(1001)).total(),
        Duration::from_millis(1001)
    );
}

#[test]
fn active_buyers_are_the_rounded_share_of_users() -> anyhow::Result<()> {
    let profile = Profile::new(vec![
        Phase::new("up", secs(10), 0.0, 1.0),
        Phase::new("hold", secs(5), 0.5, 0.5),
    ])?;
    assert_eq!(profile.active_at(secs(0), 10), 0);
    assert_eq!(profile.active_at(Duration::from_millis(450), 10), 0);
    assert_eq!(profile.active_at(Duration::from_millis(550), 10), 1);
    assert_eq!(profile.active_at(secs(10), 10), 5);
    assert_eq!(profile.active_at(secs(60), 10), 5);
    assert_eq!(profile.total(), secs(15));
    assert_eq!(Profile::constant(1.0)?.active_at(secs(3), 7), 7);
    Ok(())
}

#[test]
fn profiles_refuse_shares_outside_zero_to_one() {
    assert_eq!(Profile::new(Vec::new()), Err(ProfileError::Empty));
    assert_eq!(
        Profile::new(vec![Phase::new("over", secs(1), 0.5, 1.5)]),
        Err(ProfileError::Share {
            phase: "over".into(),
            share: 1.5
        })
    );
}

fn order(id: &str, sku: &str, quantity: u64, paid: bool) -> OrderRecord {
    OrderRecord {
        order_id: id.to_owned(),
        idempotency_key: format!("key-{id}"),
        sku: sku.to_owned(),
        quantity,
        amount_minor: 100 * quantity,
        acknowledged_at_ms: 1,
        paid,
    }
}

fn ledger() -> Ledger {
    Ledger {
        buyers: vec![
            BuyerLedger {
                user: "buyer-0".into(),
                orders: vec![order("ord-1", "A", 1, true), order("ord-2", "B", 1, false)],
                unresolved: vec![],
            },
            BuyerLedger {
                user: "buyer-1".into(),
                orders: vec![order("ord-3", "A", 2, true)],
                unresolved: vec![Unresolved {
                    idempotency_key: "k9".into(),
                    sku: "B".into(),
                    quantity: 1,
                    given_up_at_ms: 2,
                    last: "no answer".into(),
                }],
            },
        ],
    }
}

#[test]
fn the_ledger_sums_units_and_lists_orders_per_buyer() {
    let ledger = ledger();
    let ids = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(ledger.order_ids(), ids(&["ord-1", "ord-2", "ord-3"]));
    assert_eq!(ledger.paid_order_ids(), ids(&["ord-1", "ord-3"]));
    assert_eq!(
        ledger.units_acknowledged(),
        BTreeMap::from([("A".to_owned(), 3), ("B".to_owned(), 1)])
    );
    assert_eq!(ledger.units_paid(), BTreeMap::from([("A".to_owned(), 3)]));
    let users: Vec<&str> = ledger.orders().map(|(user, _)| user).collect();
    assert_eq!(users, ["buyer-0", "buyer-0", "buyer-1"]);
    let unresolved: Vec<(&str, &str)> = ledger
        .unresolved()
        .map(|(user, u)| (user, u.idempotency_key.as_str()))
        .collect();
    assert_eq!(unresolved, [("buyer-1", "k9")]);
}

#[test]
fn the_outcome_round_trips_through_json() -> anyhow::Result<()> {
    let outcome = Outcome {
        tally: Tally {
            arrived: 2,
            acknowledged: 3,
            paid: 2,
            by_code: BTreeMap::from([(201, 3), (503, 1)]),
            ..Tally::default()
        },
        ledger: ledger(),
    };
    let text = serde_json::to_string(&outcome)?;
    assert!(text.contains(r#""byCode":{"201":3,"503":1}"#), "{text}");
    assert!(text.contains(r#""orderId":"ord-1""#), "{text}");
    let back: Outcome = serde_json::from_str(&text)?;
    assert_eq!(back, outcome);
    let ledger_json: Ledger = serde_json::from_str(&outcome.ledger.to_json()?)?;
    assert_eq!(ledger_json, outcome.ledger);
    Ok(())
}

#[test]
fn a_run_can_be_spawned_on_another_task() {
    fn send<T: Send + 'static>(_: &T) {}
    let run = flashsale_play::buyers::run(
        flashsale_play::buyers::Config::default(),
        flashsale_play::buyers::Progress::hidden(),
        flashsale_play::buyers::Counters::default(),
        async {},
    );
    send(&run);
}
