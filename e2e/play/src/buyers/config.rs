//! What the buyers are told: where the gateway is, the secrets, what is on
//! sale, how many buyers and how they behave.

use std::time::Duration;

use super::{Error, Profile};

/// One SKU on sale and how many units one buyer may buy of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuLimit {
    /// The SKU.
    pub sku: String,
    /// Units one buyer may buy (the sale's per-user limit).
    pub limit: u64,
}

/// How hard a purchase retries when the answer says nothing definite.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries of one request on a 503, a transport error or a timeout (and,
    /// once the buyer winds down, on 429 and `sale_not_open`).
    pub max_retries: u32,
    /// First backoff; doubles with every retry.
    pub base: Duration,
    /// Longest backoff.
    pub cap: Duration,
    /// Wait after a 429 without `Retry-After`.
    pub rate_limited_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 6,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
            rate_limited_wait: Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// The backoff before retry number `retries` (0 for the first):
    /// `base × 2^retries`, at most `cap`. The caller adds jitter.
    pub fn backoff(&self, retries: u32) -> Duration {
        let factor = 1u32.checked_shl(retries.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// The buyers' configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Base URL of the sale's gateway, e.g. `http://127.0.0.1:8080`.
    pub gateway: String,
    /// The HS256 secret the gateway verifies bearer tokens with.
    pub jwt_secret: Vec<u8>,
    /// The secret the payment provider signs callbacks with (≥ 32 bytes).
    pub payment_secret: Vec<u8>,
    /// The SKUs on sale.
    pub skus: Vec<SkuLimit>,
    /// Buyers at the peak (share 1.0 of the profile); buyer `i` is the
    /// user `buyer-<i>`.
    pub users: usize,
    /// Share of `users` active over time.
    pub profile: Profile,
    /// Mean think time between two actions (exponentially distributed).
    pub think: Duration,
    /// Share of acknowledged orders never paid.
    pub abandon: f64,
    /// Share of actions that are purchase attempts (the rest browse).
    pub purchase_share: f64,
    /// Share of page views where the buyer reloads the page impatiently,
    /// several times in a row.
    pub impatient: f64,
    /// Seed of every random choice the buyers make.
    pub seed: u64,
    /// Bound of one HTTP request.
    pub http_timeout: Duration,
    /// Retries of one request.
    pub retry: RetryPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            gateway: "http://127.0.0.1:8080".to_owned(),
            jwt_secret: Vec::new(),
            payment_secret: Vec::new(),
            skus: Vec::new(),
            users: 100,
            profile: Profile::sale(Duration::from_secs(60)),
            think: Duration::from_secs(1),
            abandon: 0.25,
            purchase_share: 0.5,
            impatient: 0.1,
            seed: 0,
            http_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
        }
    }
}

impl Config {
    /// Refuses a configuration the buyers cannot play.
    pub fn check(&self) -> Result<(), Error> {
        let invalid = |why: &str| Err(Error::Config(why.to_owned()));
        if !(self.gateway.starts_with("http://") || self.gateway.starts_with("https://")) {
            return invalid("the gateway URL must start with http:// or https://");
        }
        if self.jwt_secret.is_empty() {
            return invalid("the JWT secret is empty");
        }
        if self.skus.is_empty() {
            return invalid("no SKU on sale");
        }
        if self.skus.iter().any(|s| s.sku.is_empty()) {
            return invalid("an empty SKU name");
        }
        for (name, share) in [
            ("abandon", self.abandon),
            ("purchase share", self.purchase_share),
            ("impatient share", self.impatient),
        ] {
            if !(0.0..=1.0).contains(&share) {
                return Err(Error::Config(format!(
                    "the {name} must be within 0-1, got {share}"
                )));
            }
        }
        if self.http_timeout.is_zero() {
            return invalid("the HTTP timeout must be positive");
        }
        // Fails now rather than at the first payment.
        gateway::payments::sign(&self.payment_secret, 0, b"")?;
        Ok(())
    }

    /// The gateway URL without a trailing slash.
    pub(crate) fn base_url(&self) -> &str {
        self.gateway.trim_end_matches('/')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RetryPolicy::default();
        let waits: Vec<u128> = (0..7).map(|r| policy.backoff(r).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn a_playable_config_passes_and_mistakes_are_named() {
        let good = Config {
            jwt_secret: b"jwt".to_vec(),
            payment_secret: vec![b'p'; 32],
            skus: vec![SkuLimit {
                sku: "A".into(),
                limit: 1,
            }],
            ..Config::default()
        };
        assert!(good.check().is_ok());
        let no_skus = Config {
            skus: Vec::new(),
            ..good.clone()
        };
        assert!(
            no_skus
                .check()
                .is_err_and(|e| e.to_string().contains("no SKU"))
        );
        let weak = Config {
            payment_secret: b"short".to_vec(),
            ..good.clone()
        };
        assert!(
            weak.check()
                .is_err_and(|e| e.to_string().contains("32 bytes"))
        );
        let abandon = Config {
            abandon: 1.5,
            ..good
        };
        assert!(
            abandon
                .check()
                .is_err_and(|e| e.to_string().contains("abandon"))
        );
    }
}
