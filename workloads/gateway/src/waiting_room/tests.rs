use std::time::Duration;

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::*;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
const SALE: &str = "sale-1111";
const TICKET_TAG: &[u8] = b"flashsale.waiting-room.ticket.v1\0";

fn signer() -> Signer {
    match Signer::new(KEY) {
        Ok(signer) => signer,
        Err(err) => panic!("a 32-byte key is accepted: {err}"),
    }
}

fn ticket() -> Ticket {
    Ticket {
        user: "alice".to_owned(),
        sale: SALE.to_owned(),
        position: 42,
        issued_at_ms: 1_700_000_000_000,
    }
}

fn challenge() -> Challenge {
    Challenge {
        user: "alice".to_owned(),
        sale: SALE.to_owned(),
        nonce: 7,
        difficulty: 12,
        expires_at_ms: 1_700_000_120_000,
    }
}

fn pass() -> Pass {
    Pass {
        user: "alice".to_owned(),
        sale: SALE.to_owned(),
        position: 42,
        expires_at_ms: 1_700_000_300_000,
    }
}

/// A token built from the documented format, independently of `Signer`.
fn token_by_hand(key: &[u8], tag: &[u8], payload: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(err) => panic!("HMAC takes any key: {err}"),
    };
    mac.update(tag);
    mac.update(payload);
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(payload),
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

fn open_ticket(token: &str) -> Result<Ticket, Refusal> {
    signer().open_ticket(token, SALE, Some("alice"))
}

fn decode(part: &str) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(part).unwrap_or_default()
}

#[test]
fn tickets_and_passes_round_trip() {
    let s = signer();
    let token = s.sign_ticket(&ticket());
    assert_eq!(s.open_ticket(&token, SALE, Some("alice")), Ok(ticket()));
    assert_eq!(s.open_ticket(&token, SALE, None), Ok(ticket()));
    let token = s.sign_pass(&pass());
    assert_eq!(s.open_pass(&token, SALE, "alice"), Ok(pass()));
}

#[test]
fn tokens_are_cookie_and_url_safe_and_deterministic() {
    let token = signer().sign_ticket(&ticket());
    assert!(
        token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
        "{token}"
    );
    assert_eq!(token.matches('.').count(), 1);
    // The same claims give the same ticket, so joining twice can return it.
    assert_eq!(token, signer().sign_ticket(&ticket()));
}

#[test]
fn the_documented_format_is_what_the_signer_reads() {
    let payload = br#"{"v":1,"u":"alice","s":"sale-1111","p":42,"i":1700000000000}"#;
    let token = token_by_hand(KEY, TICKET_TAG, payload);
    assert_eq!(open_ticket(&token), Ok(ticket()));
}

#[test]
fn a_flipped_bit_anywhere_is_forged() {
    let s = signer();
    for token in [s.sign_ticket(&ticket()), s.sign_pass(&pass())] {
        let Some((payload, code)) = token.split_once('.') else {
            panic!("no dot in {token}");
        };
        let (payload, code) = (decode(payload), decode(code));
        for (part, bytes) in [(0, &payload), (1, &code)] {
            for i in 0..bytes.len() {
                let mut parts = [payload.clone(), code.clone()];
                parts[part][i] ^= 0x01;
                let forged = format!(
                    "{}.{}",
                    URL_SAFE_NO_PAD.encode(&parts[0]),
                    URL_SAFE_NO_PAD.encode(&parts[1])
                );
                assert_eq!(
                    open_ticket(&forged),
                    Err(Refusal::Forged),
                    "part {part} byte {i}"
                );
                assert_eq!(
                    s.open_pass(&forged, SALE, "alice"),
                    Err(Refusal::Forged),
                    "part {part} byte {i}"
                );
            }
        }
    }
}

#[test]
fn a_changed_character_anywhere_is_refused() {
    let token = signer().sign_ticket(&ticket());
    for (i, c) in token.char_indices() {
        for other in ['A', 'B', '_', '-', '.', '='] {
            if other == c {
                continue;
            }
            let mut changed = token.clone();
            changed.replace_range(i..i + 1, &other.to_string());
            // Forged, or malformed when the change breaks the base64 or the
            // single dot; never accepted.
            let refusal = open_ticket(&changed).err();
            assert!(
                matches!(refusal, Some(Refusal::Forged | Refusal::Malformed)),
                "{changed}: {refusal:?}"
            );
        }
    }
}

#[test]
fn another_key_is_forged() {
    let other = match Signer::new(b"another key, also thirty-two bytes long") {
        Ok(signer) => signer,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(
        open_ticket(&other.sign_ticket(&ticket())),
        Err(Refusal::Forged)
    );
}

#[test]
fn a_ticket_is_no_pass_and_a_pass_no_ticket() {
    let s = signer();
    let ticket = s.sign_ticket(&ticket());
    let pass = s.sign_pass(&pass());
    assert_eq!(s.open_pass(&ticket, SALE, "alice"), Err(Refusal::WrongKind));
    assert_eq!(s.open_ticket(&pass, SALE, None), Err(Refusal::WrongKind));
}

#[test]
fn a_challenge_is_neither_ticket_nor_pass_nor_the_reverse() {
    let s = signer();
    let challenge = s.sign_challenge(&challenge());
    assert_eq!(
        s.open_ticket(&challenge, SALE, None),
        Err(Refusal::WrongKind)
    );
    assert_eq!(
        s.open_pass(&challenge, SALE, "alice"),
        Err(Refusal::WrongKind)
    );
    for token in [s.sign_ticket(&ticket()), s.sign_pass(&pass())] {
        assert_eq!(
            s.open_challenge(&token, SALE, "alice"),
            Err(Refusal::WrongKind)
        );
    }
}

#[test]
fn challenges_round_trip_with_their_mac_and_are_bound_to_user_and_sale() {
    let s = signer();
    let token = s.sign_challenge(&challenge());
    let (opened, mac) = match s.open_challenge(&token, SALE, "alice") {
        Ok(opened) => opened,
        Err(refusal) => panic!("a fresh challenge opens: {refusal}"),
    };
    assert_eq!(opened, challenge());
    // The MAC handed back is the token's own, the one the work hashes over.
    let (_, code) = token.split_once('.').unwrap_or_default();
    assert_eq!(URL_SAFE_NO_PAD.encode(mac), code);
    assert_eq!(
        s.open_challenge(&token, "other-sale", "alice"),
        Err(Refusal::OtherSale)
    );
    assert_eq!(
        s.open_challenge(&token, SALE, "bob"),
        Err(Refusal::OtherUser)
    );
}

#[test]
fn tickets_expire_after_their_ttl() {
    let t = ticket();
    let ttl = Duration::from_secs(3_600);
    assert_eq!(t.check_fresh(ttl, t.issued_at_ms), Ok(()));
    assert_eq!(t.check_fresh(ttl, t.issued_at_ms + 3_599_999), Ok(()));
    assert_eq!(
        t.check_fresh(ttl, t.issued_at_ms + 3_600_000),
        Err(Refusal::Expired)
    );
    // A TTL too large to add saturates instead of overflowing.
    assert_eq!(t.check_fresh(Duration::MAX, u64::MAX - 1), Ok(()));
}

#[test]
fn tokens_of_another_sale_or_user_are_refused() {
    let s = signer();
    let ticket = s.sign_ticket(&ticket());
    let pass = s.sign_pass(&pass());
    assert_eq!(
        s.open_ticket(&ticket, "other-sale", Some("alice")),
        Err(Refusal::OtherSale)
    );
    assert_eq!(
        s.open_ticket(&ticket, SALE, Some("bob")),
        Err(Refusal::OtherUser)
    );
    assert_eq!(
        s.open_pass(&pass, "other-sale", "alice"),
        Err(Refusal::OtherSale)
    );
    assert_eq!(s.open_pass(&pass, SALE, "bob"), Err(Refusal::OtherUser));
}

#[test]
fn malformed_input_is_malformed_never_a_panic() {
    let huge = "A".repeat(MAX_TOKEN_LEN + 1);
    let huge_with_dot = format!("{}.{}", "A".repeat(10_000), "A".repeat(10_000));
    let cases = [
        "",
        ".",
        "..",
        "no-dot-at-all",
        "a.b.c",
        "!!!.???",
        "eyJ2IjoxfQ.@@@",
        "eyJ2IjoxfQ==.AAAA",
        "é.é",
        "\0.\0",
        huge.as_str(),
        huge_with_dot.as_str(),
    ];
    let s = signer();
    for case in cases {
        assert_eq!(open_ticket(case), Err(Refusal::Malformed), "{case:.40}");
        assert_eq!(
            s.open_pass(case, SALE, "alice"),
            Err(Refusal::Malformed),
            "{case:.40}"
        );
    }
}

#[test]
fn a_genuine_signature_over_an_unreadable_payload_is_malformed() {
    for payload in [
        &b"not json"[..],
        b"",
        b"[]",
        b"{}",
        br#"{"v":2,"u":"alice","s":"sale-1111","p":42,"i":1}"#,
        br#"{"v":1,"u":"alice","s":"sale-1111","p":42}"#,
        br#"{"v":1,"u":"alice","s":"sale-1111","p":-1,"i":1}"#,
        br#"{"v":1,"u":"alice","s":"sale-1111","p":42,"i":1,"admin":true}"#,
    ] {
        let token = token_by_hand(KEY, TICKET_TAG, payload);
        assert_eq!(
            open_ticket(&token),
            Err(Refusal::Malformed),
            "{}",
            String::from_utf8_lossy(payload)
        );
    }
    // Without the key, an unreadable payload is just a forgery: the MAC is
    // checked before the payload is parsed.
    let token = token_by_hand(b"an attacker's key of thirty-two bytes", TICKET_TAG, b"x");
    assert_eq!(open_ticket(&token), Err(Refusal::Forged));
}

#[test]
fn short_keys_are_refused_and_keys_never_printed() {
    assert!(matches!(Signer::new(&KEY[..31]), Err(Error::WeakKey(31))));
    assert!(matches!(Signer::new(b""), Err(Error::WeakKey(0))));
    let shown = format!("{:?}", signer());
    assert!(!shown.contains("0123456789abcdef"), "{shown}");
}

#[test]
fn refusal_codes_are_distinct_snake_case() {
    let all = [
        Refusal::Malformed,
        Refusal::Forged,
        Refusal::WrongKind,
        Refusal::Expired,
        Refusal::OtherUser,
        Refusal::OtherSale,
        Refusal::Replayed,
        Refusal::Unsolved,
    ];
    let codes: std::collections::BTreeSet<_> = all.iter().map(Refusal::code).collect();
    assert_eq!(codes.len(), all.len());
    for code in codes {
        assert!(
            code.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{code}"
        );
    }
    assert_eq!(
        Error::from(Refusal::OtherUser).to_string(),
        "the token was issued to another user"
    );
}

#[test]
fn users_ahead_and_the_wait_follow_the_frontier() {
    assert_eq!(ahead(10, 4), 5);
    assert_eq!(ahead(5, 4), 0);
    assert_eq!(ahead(3, 4), 0);
    assert_eq!(estimated_wait(10, 4, 20), Duration::from_millis(300));
    assert_eq!(estimated_wait(3, 4, 20), Duration::ZERO);
    assert_eq!(estimated_wait(1, 0, 0), Duration::from_secs(1));
    assert_eq!(
        estimated_wait(u64::MAX, 0, 1),
        Duration::from_micros(u64::MAX)
    );
}

#[test]
fn the_next_poll_is_base_plus_jitter_below_its_bound() {
    let (base, jitter) = (Duration::from_secs(2), Duration::from_secs(1));
    assert_eq!(next_poll(base, jitter, 0.0), base);
    assert_eq!(next_poll(base, jitter, 0.5), Duration::from_millis(2_500));
    let top = next_poll(base, jitter, 1.0 - f64::EPSILON);
    assert!(
        top < base + jitter && top > Duration::from_millis(2_999),
        "{top:?}"
    );
    assert_eq!(next_poll(base, Duration::ZERO, 0.7), base);
    // Out-of-range units and extreme settings do not panic.
    assert_eq!(next_poll(base, jitter, f64::NAN), base);
    assert_eq!(next_poll(base, jitter, -1.0), base);
    assert_eq!(next_poll(Duration::MAX, Duration::MAX, 0.9), Duration::MAX);
    for _ in 0..1_000 {
        let poll = next_poll(base, jitter, rand::random::<f64>());
        assert!(poll >= base && poll < base + jitter, "{poll:?}");
    }
}

#[test]
fn settings_have_the_documented_defaults() {
    let s = Settings::new(SALE, 20);
    assert_eq!(s.sale, SALE);
    assert_eq!(s.admit_per_second, 20);
    assert_eq!(s.ticket_ttl, Duration::from_secs(3_600));
    assert_eq!(s.pass_ttl, Duration::from_secs(300));
    assert_eq!(s.lease_ttl, Duration::from_secs(5));
    assert_eq!(s.frontier_max_age, Duration::from_millis(250));
    assert_eq!(s.poll_base, Duration::from_secs(2));
    assert_eq!(s.poll_jitter, Duration::from_secs(1));
    assert_eq!(s.redis_timeout, Duration::from_millis(100));
    assert_eq!(
        Depth {
            issued: 7,
            admitted: 3
        }
        .waiting(),
        4
    );
}
