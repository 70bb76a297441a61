//! The work a join challenge asks for: a `solution` (an unsigned 64-bit
//! number) such that `SHA-256(mac ‖ solution as 8 bytes, big-endian)`
//! begins with the challenge's `difficulty` zero bits, `mac` being the
//! challenge token's 32-byte MAC. The input is 40 bytes, one SHA-256
//! block: checking a solution is one hash, finding one takes about
//! `2^difficulty`.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use sha2::{Digest, Sha256};

use crate::waiting_room::MAC_LEN;

/// The most leading zero bits a challenge may ask for: past this, a
/// person's device would search for minutes.
pub const MAX_DIFFICULTY: u8 = 32;

/// The MAC of challenge `token`, which its work hashes over: the token's
/// part after the dot, base64url. What a client decodes before searching.
pub fn mac_of(token: &str) -> Option<[u8; MAC_LEN]> {
    let (_, code) = token.split_once('.')?;
    URL_SAFE_NO_PAD.decode(code).ok()?.try_into().ok()
}

/// The hash a solution is judged by.
pub fn hash(mac: &[u8; MAC_LEN], solution: u64) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(mac);
    hasher.update(solution.to_be_bytes());
    hasher.finalize().into()
}

/// Leading zero bits of `hash`.
pub fn leading_zero_bits(hash: &[u8; 32]) -> u32 {
    let mut bits = 0;
    for byte in hash {
        bits += byte.leading_zeros();
        if *byte != 0 {
            break;
        }
    }
    bits
}

/// Whether `solution` does `difficulty` bits of work for the challenge
/// whose MAC is `mac`.
pub fn solves(mac: &[u8; MAC_LEN], solution: u64, difficulty: u8) -> bool {
    leading_zero_bits(&hash(mac, solution)) >= u32::from(difficulty)
}

/// The first solution from 0 upward, and how many hashes finding it took:
/// what a script or the waiting-room page does.
pub fn solve(mac: &[u8; MAC_LEN], difficulty: u8) -> (u64, u64) {
    let mut solution = 0u64;
    while !solves(mac, solution, difficulty) {
        solution += 1;
    }
    (solution, solution + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zero_bits_count_across_bytes() {
        let mut hash = [0xffu8; 32];
        assert_eq!(leading_zero_bits(&hash), 0);
        hash[0] = 0;
        hash[1] = 0b0001_0000;
        assert_eq!(leading_zero_bits(&hash), 11);
        assert_eq!(leading_zero_bits(&[0u8; 32]), 256);
    }

    #[test]
    fn a_found_solution_solves_and_its_hash_says_why() {
        let mac = [7u8; MAC_LEN];
        for difficulty in [0, 1, 8, 12] {
            let (solution, hashes) = solve(&mac, difficulty);
            assert!(solves(&mac, solution, difficulty));
            assert_eq!(hashes, solution + 1);
            // Every number before it fails, so the search found the first.
            assert!((0..solution).all(|n| !solves(&mac, n, difficulty)));
        }
        // The work is bound to the MAC: another challenge's solution is
        // none for this one (fixed inputs: a 1 in 65536 chance that was not
        // drawn).
        let (solution, _) = solve(&[8u8; MAC_LEN], 16);
        assert!(!solves(&mac, solution, 16));
    }

    #[test]
    fn the_hash_is_sha256_of_the_documented_bytes() {
        let mac = [1u8; MAC_LEN];
        let mut input = mac.to_vec();
        input.extend_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        let expected: [u8; 32] = Sha256::digest(&input).into();
        assert_eq!(hash(&mac, 0x0102_0304_0506_0708), expected);
    }
}
