use super::*;
use crate::waiting_room::{MAC_LEN, Ticket};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
const NOW_MS: u64 = 1_700_000_000_000;

fn shield_of(key: &[u8], sale: &str, difficulty_bits: Vec<u8>) -> Shield {
    let signer = match Signer::new(key) {
        Ok(signer) => signer,
        Err(err) => panic!("a 32-byte key is accepted: {err}"),
    };
    Shield::signing(
        Arc::new(signer),
        sale.to_owned(),
        Settings {
            difficulty_bits,
            challenge_ttl: Duration::from_secs(120),
        },
    )
}

fn shield() -> Shield {
    shield_of(KEY, "sale-1111", vec![8, 10, 12])
}

/// The MAC a solution hashes over.
fn mac_of(token: &str) -> [u8; MAC_LEN] {
    work::mac_of(token).unwrap_or([0; MAC_LEN])
}

fn solved(issued: &Issued) -> String {
    let (solution, _) = work::solve(&mac_of(&issued.token), issued.difficulty);
    format!("{}:{solution}", issued.token)
}

#[test]
fn the_difficulty_is_the_tiers_entry_and_the_last_for_higher_tiers() {
    let settings = shield().settings().clone();
    let by_tier: Vec<u8> = (0..5).map(|tier| settings.difficulty(tier)).collect();
    assert_eq!(by_tier, [8, 10, 12, 12, 12]);
    let none = Settings {
        difficulty_bits: Vec::new(),
        challenge_ttl: Duration::from_secs(1),
    };
    assert_eq!(none.difficulty(2), 0);
}

#[test]
fn a_solved_challenge_is_the_spend_of_its_nonce_and_expiry() {
    let shield = shield();
    let issued = shield.issue("alice", 1, NOW_MS);
    assert_eq!(issued.difficulty, 10);
    assert_eq!(issued.expires_at_ms, NOW_MS + 120_000);
    let spend = shield.check(&solved(&issued), "alice");
    assert_eq!(spend.map(|s| s.expires_at_ms), Ok(NOW_MS + 120_000));
    // Two challenges never share a nonce, so each is spent on its own.
    let again = shield.issue("alice", 1, NOW_MS);
    let nonces = [&issued, &again].map(|i| shield.check(&solved(i), "alice").map(|s| s.nonce));
    assert_ne!(nonces[0], nonces[1]);
}

#[test]
fn a_challenge_is_judged_by_the_difficulty_it_was_issued_with() {
    // Issued at tier 0 (8 bits), solved after the tier rose to 2 (12
    // bits): its solution is judged by its own 8 bits.
    let shield = shield();
    let issued = shield.issue("alice", 0, NOW_MS);
    let proof = solved(&issued);
    let (_, solution) = proof.rsplit_once(':').unwrap_or_default();
    let solution: u64 = solution.parse().unwrap_or_default();
    assert_eq!(
        shield.settings().difficulty(2),
        12,
        "the tier's difficulty rose"
    );
    assert!(shield.check(&proof, "alice").is_ok());
    // A solution short of the challenge's own bits is unsolved: the next
    // number that fails them.
    let lazy = (solution + 1..)
        .find(|&n| !work::solves(&mac_of(&issued.token), n, issued.difficulty))
        .unwrap_or_default();
    assert_eq!(
        shield.check(&format!("{}:{lazy}", issued.token), "alice"),
        Err(Refusal::Unsolved)
    );
}

#[test]
fn foreign_forged_and_malformed_proofs_are_refused_by_name() {
    let shield = shield();
    let proof = solved(&shield.issue("alice", 0, NOW_MS));
    assert_eq!(shield.check(&proof, "bob"), Err(Refusal::OtherUser));
    let other_sale = shield_of(KEY, "sale-2222", vec![8]);
    assert_eq!(other_sale.check(&proof, "alice"), Err(Refusal::OtherSale));
    let other_key = shield_of(b"another key of thirty-two bytes!", "sale-1111", vec![8]);
    assert_eq!(other_key.check(&proof, "alice"), Err(Refusal::Forged));
    // A queue ticket of the same key is no challenge.
    let ticket = shield.signer.sign_ticket(&Ticket {
        user: "alice".to_owned(),
        sale: "sale-1111".to_owned(),
        position: 1,
        issued_at_ms: NOW_MS,
    });
    assert_eq!(
        shield.check(&format!("{ticket}:0"), "alice"),
        Err(Refusal::WrongKind)
    );
    let token = proof.rsplit_once(':').map(|(t, _)| t).unwrap_or_default();
    for malformed in [
        String::new(),
        token.to_owned(),
        format!("{token}:"),
        format!("{token}:-1"),
        format!("{token}:0x10"),
        format!("{token}:18446744073709551616"),
        "a:b:c".to_owned(),
    ] {
        assert_eq!(
            shield.check(&malformed, "alice"),
            Err(Refusal::Malformed),
            "{malformed:.60}"
        );
    }
}
