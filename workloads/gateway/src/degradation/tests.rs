use super::{file::parse_file, *};

fn state(generation: u64, tier: u32) -> Degradation {
    Degradation {
        tier,
        generation,
        ..Degradation::default()
    }
}

/// Generations as the writer makes them: the clock in milliseconds.
fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_millisecond(1_794_355_200_000).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

#[test]
fn apply_ignores_stale_and_equal_generations() {
    let board = Switchboard::new();
    assert_eq!(*board.current(), Degradation::default());
    let mut updates = board.subscribe();

    assert!(board.apply(state(5, 2), now()));
    assert!(updates.has_changed().unwrap_or(false));
    updates.mark_unchanged();
    // A stale event (lower) and a repeat (equal, even with other content)
    // change nothing and wake nobody.
    assert!(!board.apply(state(4, 0), now()));
    assert!(!board.apply(state(5, 1), now()));
    assert_eq!(*board.current(), state(5, 2));
    assert!(!updates.has_changed().unwrap_or(true));

    let clone = board.clone();
    assert!(clone.apply(state(6, 0), now()));
    assert_eq!(board.current().generation, 6, "clones share the state");
}

#[test]
fn a_hand_edited_generation_never_freezes_the_board() {
    let board = Switchboard::new();
    assert!(board.apply(state(7, 1), now()));
    // Someone sets the ConfigMap's generation to the largest number.
    assert!(!board.apply(state(u64::MAX, 2), now()));
    assert_eq!(*board.current(), state(7, 1));
    // The writer's next state, at the clock, goes through.
    assert!(board.apply(state(8, 0), now()));
    assert_eq!(board.current().tier, 0);
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
        override_expires: None,
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
