//! The user id rule: which buyer ids the order path accepts. The gateway
//! applies it to a token's `sub`, the inventory to a reservation's user, and
//! the order event to its `user_id`, so an id one part takes every other
//! part takes too.
//!
//! A user id is 1 to [`MAX_USER_ID_BYTES`] bytes of ASCII letters, digits
//! and `-` `_` `.` `:` `@` `+` `|`. That admits e-mail addresses (with
//! `+` sub-addressing), UUIDs, URNs and provider-prefixed subjects such as
//! `auth0|…`. The id is embedded in Redis key names (`fs:{S}:user:<K>:<U>`,
//! `fs:{S}:rl:<U>`, `fs:{S}:wr:user:<U>`), is the Kafka key, fills the
//! `user_id VARCHAR(128)` column and travels in JSON bodies and logs, so
//! refused are:
//! - non-ASCII: OpenID Connect defines `sub` as ASCII, and bytes outside it
//!   would meet database encodings and Unicode look-alikes in logs;
//! - whitespace and control characters: log lines, and PostgreSQL refuses
//!   NUL in text;
//! - `/ ? # % * [ ] { } \ "` and the rest: URL paths, Redis patterns and
//!   hash tags, JSON and log escaping.
//!
//! Comparison is byte for byte (`sub` is case-sensitive).

/// Longest user id, in bytes: the order row's `user_id` column and the
/// order event's limit. OpenID Connect allows a `sub` of up to 255.
pub const MAX_USER_ID_BYTES: usize = 128;

/// Why a string is not a user id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidUserId {
    /// Empty.
    #[error("a user id must not be empty")]
    Empty,
    /// Longer than [`MAX_USER_ID_BYTES`].
    #[error("a user id has at most {MAX_USER_ID_BYTES} bytes, not {0}")]
    TooLong(usize),
    /// A character outside the rule (shown escaped, so a control character
    /// cannot break the line it is logged on).
    #[error("a user id may only hold ASCII letters, digits and - _ . : @ + |, not {0:?}")]
    Character(char),
}

/// Checks `id` against the user id rule (see the module documentation).
pub fn check_user_id(id: &str) -> Result<(), InvalidUserId> {
    if id.is_empty() {
        return Err(InvalidUserId::Empty);
    }
    if id.len() > MAX_USER_ID_BYTES {
        return Err(InvalidUserId::TooLong(id.len()));
    }
    match id.chars().find(|&c| {
        !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '@' | '+' | '|'))
    }) {
        Some(c) => Err(InvalidUserId::Character(c)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_uuids_and_provider_subjects_are_user_ids() {
        for id in [
            "u1",
            "ann@example.com",
            "ann.buyer+sale@mail.example.co.uk",
            "0b5e7c1a-58f4-4f7e-9a43-3c1d2e4f5a6b",
            "auth0|64f1c2d3e4",
            "urn:buyer:42",
            "AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ",
            &"x".repeat(MAX_USER_ID_BYTES),
        ] {
            assert_eq!(check_user_id(id), Ok(()), "{id}");
        }
    }

    #[test]
    fn everything_else_is_refused_with_its_reason() {
        use InvalidUserId::*;
        for (id, why) in [
            ("", Empty),
            ("josé@example.com", Character('é')),
            ("用户@例子.广告", Character('用')),
            ("ann buyer", Character(' ')),
            ("ann\u{0}", Character('\u{0}')),
            ("ann\nINFO forged", Character('\n')),
            ("a/b", Character('/')),
            ("fs:{other}:x", Character('{')),
            ("u*", Character('*')),
            ("\"quoted\"", Character('"')),
        ] {
            assert_eq!(check_user_id(id), Err(why), "{id:?}");
        }
        let long = "x".repeat(MAX_USER_ID_BYTES + 1);
        assert_eq!(check_user_id(&long), Err(TooLong(MAX_USER_ID_BYTES + 1)));
        // Shown escaped: a control character cannot break a log line.
        assert_eq!(
            Character('\n').to_string(),
            "a user id may only hold ASCII letters, digits and - _ . : @ + |, not '\\n'"
        );
    }
}
