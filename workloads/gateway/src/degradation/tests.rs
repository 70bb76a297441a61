use std::collections::BTreeMap;

use super::{file::parse_file, *};

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn state(generation: u64, tier: u32) -> Degradation {
    Degradation {
        tier,
        generation,
        ..Degradation::default()
    }
}

#[test]
fn a_full_data_map_parses() {
    let parsed = Degradation::from_data(&data(&[
        ("tier", "2"),
        ("generation", "17"),
        (
            "switches",
            r#"{"recommendations":"static","orderHistory":"last7Days","voucherPush":"deferred",
                "reviews":"queued","shopChat":"throttled","miniGames":"closed"}"#,
        ),
        ("reason", "checkout p99 at 1.4x budget"),
        ("changedAt", "2026-11-11T00:00:03Z"),
    ]));
    let expected = Degradation {
        tier: 2,
        generation: 17,
        switches: Switches {
            recommendations: RecommendationsMode::Static,
            order_history: OrderHistoryMode::Last7Days,
            voucher_push: VoucherPushMode::Deferred,
            reviews: ReviewsMode::Queued,
            shop_chat: ShopChatMode::Throttled,
            mini_games: MiniGamesMode::Closed,
        },
        reason: "checkout p99 at 1.4x budget".to_owned(),
        changed_at: "2026-11-11T00:00:03Z".parse().ok(),
    };
    assert!(expected.changed_at.is_some());
    assert_eq!(parsed, Ok(expected));
}

#[test]
fn features_left_out_run_normally_and_optional_keys_may_be_absent() {
    let partial = Degradation::from_data(&data(&[
        ("tier", "1"),
        ("generation", "3"),
        ("switches", r#"{"reviews":"queued","miniGames":"normal"}"#),
    ]));
    let expected = Switches {
        reviews: ReviewsMode::Queued,
        ..Switches::default()
    };
    assert_eq!(partial.map(|d| d.switches), Ok(expected));

    let bare = Degradation::from_data(&data(&[("tier", "0"), ("generation", "1")]));
    assert_eq!(bare, Ok(state(1, 0)));
    // Keys this release does not know are left for a newer gateway.
    let newer = Degradation::from_data(&data(&[
        ("tier", "0"),
        ("generation", "1"),
        ("rolloutHint", "x"),
    ]));
    assert_eq!(newer, Ok(state(1, 0)));
}

#[test]
fn tier_and_generation_are_required() {
    assert_eq!(
        Degradation::from_data(&data(&[("generation", "1")])),
        Err(ParseError::Missing { key: "tier" })
    );
    assert_eq!(
        Degradation::from_data(&data(&[("tier", "1")])),
        Err(ParseError::Missing { key: "generation" })
    );
}

#[test]
fn bad_values_name_their_key() {
    let cases = [
        ("tier", "two", "`tier`"),
        ("tier", "-1", "`tier`"),
        ("generation", "1.5", "`generation`"),
        ("switches", "reviews=queued", "`switches`"),
        ("switches", r#"{"reviews":1}"#, "`switches`"),
        ("changedAt", "yesterday", "`changedAt`"),
    ];
    for (key, value, named) in cases {
        let mut map = data(&[("tier", "1"), ("generation", "2")]);
        map.insert(key.to_owned(), value.to_owned());
        let err = Degradation::from_data(&map)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(named), "{key}={value}: {err}");
        assert!(err.contains(&format!("{value:?}")), "{key}={value}: {err}");
    }
}

#[test]
fn an_unknown_feature_or_mode_is_an_error_not_normal() {
    let parse = |switches: &str| {
        Degradation::from_data(&data(&[
            ("tier", "1"),
            ("generation", "2"),
            ("switches", switches),
        ]))
    };
    let feature = parse(r#"{"checkout":"closed"}"#);
    assert_eq!(
        feature,
        Err(ParseError::UnknownFeature {
            feature: "checkout".to_owned()
        })
    );
    let text = feature.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        text.contains("`switches`") && text.contains("miniGames"),
        "{text}"
    );

    let mode = parse(r#"{"reviews":"queud"}"#);
    let Err(ParseError::UnknownMode {
        feature,
        mode,
        reason,
    }) = &mode
    else {
        panic!("expected an unknown mode, got {mode:?}");
    };
    assert_eq!((feature.as_str(), mode.as_str()), ("reviews", "queud"));
    assert!(reason.contains("queued"), "names the valid modes: {reason}");
    // Modes are case-sensitive, as in the CRD.
    assert!(parse(r#"{"reviews":"Queued"}"#).is_err());
}

#[test]
fn huge_values_are_cut_in_errors() {
    let huge = "9".repeat(10_000);
    let err = Degradation::from_data(&data(&[("tier", &huge), ("generation", "1")]));
    let text = err.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.len() < 1_000, "{} bytes", text.len());
}

#[test]
fn apply_ignores_stale_and_equal_generations() {
    let board = Switchboard::new();
    assert_eq!(*board.current(), Degradation::default());
    let mut updates = board.subscribe();

    assert!(board.apply(state(5, 2)));
    assert!(updates.has_changed().unwrap_or(false));
    updates.mark_unchanged();
    // A stale event (lower) and a repeat (equal, even with other content)
    // change nothing and wake nobody.
    assert!(!board.apply(state(4, 0)));
    assert!(!board.apply(state(5, 1)));
    assert_eq!(*board.current(), state(5, 2));
    assert!(!updates.has_changed().unwrap_or(true));

    let clone = board.clone();
    assert!(clone.apply(state(6, 0)));
    assert_eq!(board.current().generation, 6, "clones share the state");
}

#[test]
fn the_file_may_hold_the_data_map_as_yaml_or_json_or_a_manifest() {
    let expected = Degradation {
        tier: 2,
        generation: 9,
        switches: Switches {
            reviews: ReviewsMode::Queued,
            ..Switches::default()
        },
        reason: "load".to_owned(),
        changed_at: None,
    };
    let yaml = "tier: \"2\"\ngeneration: 9\nswitches: '{\"reviews\":\"queued\"}'\nreason: load\n";
    let json =
        r#"{"tier":"2","generation":"9","switches":"{\"reviews\":\"queued\"}","reason":"load"}"#;
    let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: s-degradation\ndata:\n  \
                    tier: \"2\"\n  generation: \"9\"\n  switches: '{\"reviews\":\"queued\"}'\n  \
                    reason: load\n";
    for content in [yaml, json, manifest] {
        let parsed = parse_file(content.as_bytes()).map_err(|e| e.to_string());
        assert_eq!(parsed, Ok(expected.clone()), "{content}");
    }
}

#[test]
fn a_bad_file_says_why() {
    let cases = [
        ("", "key `tier` is missing"),
        ("- a\n- b\n", "not a YAML or JSON map"),
        ("tier: [", "not a YAML or JSON map"),
        ("kind: Secret\ndata: {}\n", "kind \"Secret\""),
        ("kind: ConfigMap\ndata: [1]\n", "`data` must be a map"),
        ("kind: ConfigMap\n", "key `tier` is missing"),
        (
            "tier: 1\ngeneration: 2\nswitches:\n  reviews: queued\n",
            "key `switches` must be a string",
        ),
        (
            "tier: 1\ngeneration: 2\nswitches: '{\"reviews\":\"later\"}'\n",
            "unknown mode \"later\"",
        ),
    ];
    for (content, why) in cases {
        let err = parse_file(content.as_bytes())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(why), "{content:?}: {err}");
    }
}
