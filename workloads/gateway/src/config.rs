//! The gateway's sale configuration: one JSON document (the operator renders
//! it into a ConfigMap from the FlashSale spec), checked once at start so a
//! bad value stops the process with a message instead of misbehaving later.

use std::{num::NonZeroU32, path::Path, time::Duration};

use axum::http::HeaderName;
use ipnet::IpNet;
use jiff::Timestamp;
use serde::{Deserialize, Deserializer, de::Visitor};

use crate::{
    concurrency, ratelimit,
    window::{self, WindowState},
};

/// Why the configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the gateway configuration {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not the expected JSON.
    #[error("the gateway configuration {path} is not valid: {source}")]
    Parse {
        /// The path given.
        path: String,
        /// What serde said (names the field).
        source: serde_json::Error,
    },
    /// A value out of range.
    #[error("gateway configuration: {0}")]
    Invalid(String),
}

/// The sale this gateway serves and how it sheds load.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayConfig {
    /// Sale name (the inventory's and the events' `sale`).
    pub sale: String,
    /// What is for sale, with prices.
    pub items: Vec<ItemPrice>,
    /// ISO 4217 code of the prices; a payment in another currency is refused.
    pub currency: String,
    /// Per-user GCRA rate limit.
    #[serde(default)]
    pub rate_limit: RateLimitConfig,
    /// Virtual waiting room in front of checkout.
    #[serde(default)]
    pub waiting_room: WaitingRoomConfig,
    /// Adaptive concurrency limit bounds.
    #[serde(default)]
    pub concurrency: ConcurrencyConfig,
    /// Budget of one order request, all downstream calls and retries included.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a stock answer is served from memory.
    #[serde(default = "default_item_cache_ms")]
    pub item_cache_ms: u64,
    /// How long a SKU found sold out is answered so from memory, its orders
    /// and its item page, before the inventory is asked again: the bound on
    /// learning a restock (plus the inventory's own, 200 ms by default).
    #[serde(default = "default_sold_out_recheck_ms")]
    pub sold_out_recheck_ms: u64,
    /// When orders open (RFC 3339 with any offset); absent: already open.
    #[serde(default, deserialize_with = "opens_at")]
    pub opens_at: Option<Timestamp>,
    /// When orders close (RFC 3339 with any offset); absent: never. Paying
    /// for an order reserved before stays possible after it.
    #[serde(default, deserialize_with = "closes_at")]
    pub closes_at: Option<Timestamp>,
    /// The region this gateway serves in, stamped on every answer as
    /// [`flashsale_runtime::REGION_HEADER`] so a client (or a failover
    /// drill) behind a global endpoint sees which region answered.
    #[serde(default)]
    pub region: Option<String>,
}

/// One SKU and its price.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ItemPrice {
    /// Stock-keeping unit.
    pub sku: String,
    /// Unit price in minor units of the sale's currency.
    pub price_minor: i64,
}

/// Per-user rate limit settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests per second per user (whole numbers; the operator
    /// rounds the spec's value up).
    pub per_user_per_second: u32,
    /// Requests allowed back to back.
    pub burst: u32,
    /// Longest wait for Redis's decision before the replica decides
    /// locally, milliseconds.
    #[serde(default = "default_rate_redis_timeout_ms")]
    pub redis_timeout_ms: u64,
}

/// A decision is on every order's path: a slow Redis must not become a
/// slow order.
fn default_rate_redis_timeout_ms() -> u64 {
    5
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            per_user_per_second: 5,
            burst: 10,
            redis_timeout_ms: default_rate_redis_timeout_ms(),
        }
    }
}

/// Waiting-room settings (the signing key comes from a file, not from here).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitingRoomConfig {
    /// Whether buyers queue before checkout.
    #[serde(default)]
    pub enabled: bool,
    /// Users admitted per second across all replicas.
    #[serde(default = "default_admit_per_second")]
    pub admit_per_second: u32,
    /// How long an admitted user's pass stays valid.
    #[serde(default = "default_pass_ttl_seconds")]
    pub pass_ttl_seconds: u64,
    /// Set the ticket and pass cookies without `Secure`, for local runs over
    /// plain HTTP; never behind TLS.
    #[serde(default)]
    pub insecure_cookies: bool,
    /// The proof of work in front of the queue's join, or of every order
    /// when the room is off; none when absent.
    #[serde(default)]
    pub bot_shield: Option<BotShieldConfig>,
}

impl Default for WaitingRoomConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            admit_per_second: default_admit_per_second(),
            pass_ttl_seconds: default_pass_ttl_seconds(),
            insecure_cookies: false,
            bot_shield: None,
        }
    }
}

/// The bot shield of the waiting room's join, or of every order when the
/// room is off ([`crate::bot_shield`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BotShieldConfig {
    /// Leading zero bits a proof needs, by degradation tier; the last entry
    /// serves every higher tier.
    pub difficulty_bits: Vec<u8>,
    /// How long a challenge may be solved and spent.
    #[serde(default = "default_challenge_ttl_seconds")]
    pub challenge_ttl_seconds: u64,
    /// Proven joins (or orders, without a room) per source, whatever the
    /// accounts; none when absent.
    #[serde(default)]
    pub per_source: Option<PerSourceConfig>,
}

/// The per-source budget of proven joins, or orders without a room
/// ([`crate::bot_shield::source`]); the names say joins, what they are
/// with a room.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PerSourceConfig {
    /// Joins per second one source may make, sustained.
    pub joins_per_second: u32,
    /// Joins one source may make back to back.
    pub burst: u32,
    /// The header naming the source (a fingerprint such as JA4 set by the
    /// edge), taken only from `trustedProxies`; the peer's address else.
    #[serde(default)]
    pub header: Option<String>,
    /// The proxies (CIDRs) whose `header` is believed.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
}

impl PerSourceConfig {
    /// The header's name and the trusted networks, or why they are not
    /// valid.
    pub fn parsed(&self) -> Result<(Option<HeaderName>, Vec<IpNet>), String> {
        let header = self
            .header
            .as_deref()
            .map(|name| {
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("perSource.header {name:?} is no header name"))
            })
            .transpose()?;
        let trusted = self
            .trusted_proxies
            .iter()
            .map(|net| {
                net.parse::<IpNet>()
                    .or_else(|_| net.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("perSource.trustedProxies: {net:?} is no address or CIDR"))
            })
            .collect::<Result<_, _>>()?;
        Ok((header, trusted))
    }

    /// The source quota's rate-limit settings.
    pub fn rate_settings(&self) -> ratelimit::Settings {
        ratelimit::Settings::new(ratelimit::Policy {
            rate: NonZeroU32::new(self.joins_per_second).unwrap_or(NonZeroU32::MIN),
            burst: NonZeroU32::new(self.burst).unwrap_or(NonZeroU32::MIN),
        })
    }
}

impl BotShieldConfig {
    /// What is wrong with it, as the rest of the field's path and why.
    fn check(&self) -> Result<(), String> {
        let max = crate::bot_shield::work::MAX_DIFFICULTY;
        if self.difficulty_bits.is_empty() || self.difficulty_bits.iter().any(|&bits| bits > max) {
            return Err(format!(
                ".difficultyBits needs 1 or more entries of 0-{max}, got {:?}",
                self.difficulty_bits
            ));
        }
        if self.challenge_ttl_seconds == 0 {
            return Err(".challengeTtlSeconds must be at least 1".into());
        }
        if let Some(per_source) = &self.per_source {
            if per_source.joins_per_second == 0 || per_source.burst == 0 {
                return Err(".perSource.joinsPerSecond and burst must be at least 1".into());
            }
            per_source.parsed().map_err(|why| format!(".{why}"))?;
        }
        Ok(())
    }

    /// The shield's settings.
    pub fn settings(&self) -> crate::bot_shield::Settings {
        crate::bot_shield::Settings {
            difficulty_bits: self.difficulty_bits.clone(),
            challenge_ttl: Duration::from_secs(self.challenge_ttl_seconds),
        }
    }
}

/// Bounds of the adaptive concurrency limit.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConcurrencyConfig {
    /// The limit never falls below this.
    pub min_limit: usize,
    /// The limit never rises above this.
    pub max_limit: usize,
    /// Percent of the limit kept for tier-0 (checkout) traffic: non-core
    /// routes may hold at most the rest.
    #[serde(default = "default_reserved_percent")]
    pub tier0_reserved_percent: u32,
}

/// The FlashSale CRD's defaults, so a gateway run by hand behaves like one
/// the operator configured.
impl Default for ConcurrencyConfig {
    fn default() -> Self {
        Self {
            min_limit: 20,
            max_limit: 1000,
            tier0_reserved_percent: default_reserved_percent(),
        }
    }
}

fn opens_at<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Timestamp>, D::Error> {
    timestamp(deserializer, "opensAt")
}

fn closes_at<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Timestamp>, D::Error> {
    timestamp(deserializer, "closesAt")
}

/// An optional RFC 3339 timestamp; a bad one is refused naming `field`
/// (serde's messages would not name it).
fn timestamp<'de, D: Deserializer<'de>>(
    deserializer: D,
    field: &'static str,
) -> Result<Option<Timestamp>, D::Error> {
    deserializer.deserialize_option(TimestampVisitor(field))
}

/// Visits `null` or an RFC 3339 string for the field it names.
struct TimestampVisitor(&'static str);

impl<'de> Visitor<'de> for TimestampVisitor {
    type Value = Option<Timestamp>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} as an RFC 3339 timestamp such as \"2026-11-11T00:00:00Z\"",
            self.0
        )
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
        text.parse().map(Some).map_err(|err| {
            E::custom(format!(
                "{} {text:?} is not an RFC 3339 timestamp such as \"2026-11-11T00:00:00Z\": {err}",
                self.0
            ))
        })
    }
}

fn default_reserved_percent() -> u32 {
    30
}

fn default_admit_per_second() -> u32 {
    500
}

fn default_pass_ttl_seconds() -> u64 {
    300
}

fn default_challenge_ttl_seconds() -> u64 {
    120
}

fn default_request_timeout_ms() -> u64 {
    2_000
}

fn default_item_cache_ms() -> u64 {
    500
}

fn default_sold_out_recheck_ms() -> u64 {
    1_000
}

/// A region name as a Kubernetes label value has it, so it is also a valid
/// header value.
fn valid_region(region: &str) -> bool {
    let bytes = region.as_bytes();
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl GatewayConfig {
    /// Reads and checks the configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let config: Self = serde_json::from_str(&text).map_err(|source| ConfigError::Parse {
            path: shown,
            source,
        })?;
        config.check()?;
        Ok(config)
    }

    /// Checks ranges serde cannot express.
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        if self.sale.is_empty() || self.sale.len() > 128 {
            return invalid("sale must be 1-128 characters".into());
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return invalid(format!(
                "currency must be an ISO 4217 code such as CNY, got {:?}",
                self.currency
            ));
        }
        if self.items.is_empty() {
            return invalid("items must not be empty".into());
        }
        if let Some(item) = self.items.iter().find(|i| i.price_minor < 0) {
            return invalid(format!("priceMinor of {} must not be negative", item.sku));
        }
        if self.rate_limit.per_user_per_second == 0 || self.rate_limit.burst == 0 {
            return invalid("rateLimit.perUserPerSecond and burst must be at least 1".into());
        }
        if self.waiting_room.admit_per_second == 0 || self.waiting_room.pass_ttl_seconds == 0 {
            return invalid(
                "waitingRoom.admitPerSecond and passTtlSeconds must be at least 1".into(),
            );
        }
        if let Some(shield) = &self.waiting_room.bot_shield {
            shield
                .check()
                .map_err(|why| ConfigError::Invalid(format!("waitingRoom.botShield{why}")))?;
        }
        let c = &self.concurrency;
        if c.min_limit == 0 || c.max_limit < c.min_limit {
            return invalid("concurrency needs 1 <= minLimit <= maxLimit".into());
        }
        if c.tier0_reserved_percent > 100 {
            return invalid("concurrency.tier0ReservedPercent must be 0-100".into());
        }
        if self.request_timeout_ms == 0 {
            return invalid("requestTimeoutMs must be positive".into());
        }
        if self.sold_out_recheck_ms > 60_000 {
            return invalid(format!(
                "soldOutRecheckMs must be 0-60000 (0: never answer sold out from memory), got {}",
                self.sold_out_recheck_ms
            ));
        }
        if let Some(region) = &self.region
            && !valid_region(region)
        {
            return invalid(format!(
                "region must be 1-63 letters, digits, '-', '_' or '.', starting and ending \
                 with a letter or digit, got {region:?}"
            ));
        }
        if let (Some(opens), Some(closes)) = (self.opens_at, self.closes_at)
            && closes <= opens
        {
            return invalid(format!(
                "closesAt ({closes}) must be after opensAt ({opens})"
            ));
        }
        Ok(())
    }

    /// The unit price of `sku`, if the sale has it.
    pub fn price(&self, sku: &str) -> Option<i64> {
        self.items
            .iter()
            .find(|i| i.sku == sku)
            .map(|i| i.price_minor)
    }

    /// The rate limiter's policy and Redis bound.
    pub fn rate_settings(&self) -> ratelimit::Settings {
        let mut settings = ratelimit::Settings::new(ratelimit::Policy {
            rate: NonZeroU32::new(self.rate_limit.per_user_per_second).unwrap_or(NonZeroU32::MIN),
            burst: NonZeroU32::new(self.rate_limit.burst).unwrap_or(NonZeroU32::MIN),
        });
        settings.redis_timeout = Duration::from_millis(self.rate_limit.redis_timeout_ms);
        settings
    }

    /// The concurrency limiter settings.
    pub fn concurrency_settings(&self) -> concurrency::Settings {
        let defaults = concurrency::Settings::default();
        let c = &self.concurrency;
        concurrency::Settings {
            min_limit: c.min_limit,
            max_limit: c.max_limit,
            // The limiter clamps it into [min, max] itself.
            initial_limit: defaults.initial_limit,
            non_core_share: 1.0 - f64::from(c.tier0_reserved_percent.min(100)) / 100.0,
            ..defaults
        }
    }

    /// Where `now` falls in the sale window (`opensAt`..`closesAt`).
    pub fn window_state(&self, now: Timestamp) -> WindowState {
        window::window_state(now, self.opens_at, self.closes_at)
    }

    /// The order budget.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<GatewayConfig, String> {
        let config: GatewayConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        config.check().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn a_minimal_config_gets_defaults() -> Result<(), String> {
        let config =
            parse(r#"{"sale":"s1","currency":"CNY","items":[{"sku":"A","priceMinor":100}]}"#)?;
        assert_eq!(config.rate_limit.per_user_per_second, 5);
        assert!(!config.waiting_room.enabled);
        assert!(
            !config.waiting_room.insecure_cookies,
            "cookies are Secure by default"
        );
        assert_eq!(config.request_timeout(), Duration::from_secs(2));
        assert_eq!(config.price("A"), Some(100));
        Ok(())
    }

    #[test]
    fn bad_values_are_named() {
        let unknown = parse(r#"{"sale":"s1","currency":"CNY","items":[],"rateLimt":{}}"#);
        assert!(unknown.is_err_and(|e| e.contains("rateLimt")));
        let empty = parse(r#"{"sale":"s1","currency":"CNY","items":[]}"#);
        assert!(empty.is_err_and(|e| e.contains("items")));
        let bounds = parse(
            r#"{"sale":"s1","currency":"CNY","items":[{"sku":"A","priceMinor":1}],"concurrency":{"minLimit":9,"maxLimit":3}}"#,
        );
        assert!(bounds.is_err_and(|e| e.contains("minLimit")));
    }

    const BASE: &str = r#""sale":"s1","currency":"CNY","items":[{"sku":"A","priceMinor":1}]"#;

    #[test]
    fn a_region_is_a_label_value_or_refused() -> Result<(), String> {
        let region = |value: &str| parse(&format!(r#"{{{BASE},"region":{value:?}}}"#));
        assert_eq!(region("cn-east-1")?.region.as_deref(), Some("cn-east-1"));
        assert_eq!(region("eu_west.2")?.region.as_deref(), Some("eu_west.2"));
        for bad in ["", "-a", "a-", "a b", "a\nb", "华东", &"a".repeat(64)] {
            assert!(
                region(bad).is_err_and(|e| e.contains("region")),
                "{bad:?} accepted"
            );
        }
        assert_eq!(parse(&format!("{{{BASE}}}"))?.region, None);
        Ok(())
    }

    fn with_window(fields: &str) -> Result<GatewayConfig, String> {
        parse(&format!("{{{BASE}{fields}}}"))
    }

    fn at(text: &str) -> Result<Timestamp, String> {
        text.parse().map_err(|e: jiff::Error| e.to_string())
    }

    #[test]
    fn the_sale_window_is_optional() -> Result<(), String> {
        let none = with_window("")?;
        assert_eq!((none.opens_at, none.closes_at), (None, None));
        assert_eq!(none.window_state(Timestamp::MAX), WindowState::Open);

        let both = with_window(
            r#","opensAt":"2026-11-11T00:00:00Z","closesAt":"2026-11-11T10:00:00+08:00""#,
        )?;
        assert_eq!(both.opens_at, Some(at("2026-11-11T00:00:00Z")?));
        // Any offset: 10:00 at +08:00 is 02:00 UTC.
        assert_eq!(both.closes_at, Some(at("2026-11-11T02:00:00Z")?));

        let opens = with_window(r#","opensAt":"2026-11-11T00:00:00-05:00""#)?;
        assert_eq!(
            (opens.opens_at, opens.closes_at),
            (Some(at("2026-11-11T05:00:00Z")?), None)
        );
        let closes = with_window(r#","closesAt":"2026-11-11T00:00:00Z""#)?;
        assert_eq!(
            (closes.opens_at, closes.closes_at),
            (None, Some(at("2026-11-11T00:00:00Z")?))
        );
        let null = with_window(r#","opensAt":null"#)?;
        assert_eq!(null.opens_at, None);
        Ok(())
    }

    #[test]
    fn a_window_closing_before_it_opens_is_refused() {
        for closes in ["2026-11-10T00:00:00Z", "2026-11-11T00:00:00Z"] {
            let refused = with_window(&format!(
                r#","opensAt":"2026-11-11T00:00:00Z","closesAt":"{closes}""#
            ));
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|e| e.contains("closesAt") && e.contains("after opensAt")),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn a_bad_timestamp_is_refused_naming_the_field() {
        for (field, value) in [
            ("opensAt", r#""2026-11-11""#),
            ("opensAt", r#""2026-11-11T00:00:00""#),
            ("closesAt", r#""tomorrow""#),
            ("closesAt", r#""2026-13-01T00:00:00Z""#),
        ] {
            let refused = with_window(&format!(r#","{field}":{value}"#));
            assert!(
                refused.as_ref().is_err_and(|e| e.contains(field)),
                "{field}={value}: {refused:?}"
            );
        }
        let not_a_string = with_window(r#","opensAt":1700000000"#);
        assert!(
            not_a_string.as_ref().is_err_and(|e| e.contains("opensAt")),
            "{not_a_string:?}"
        );
    }
}
