//! The per-source budget of joins: besides each user's own rate limit, one
//! quota per source, so a script with many accounts behind one address (or
//! one client fingerprint) cannot spread its rate across them.
//!
//! A source is the peer's IP address, or, when the peer is one of the
//! configured trusted proxies and sets the configured header (a TLS
//! fingerprint such as JA4 that the edge computes), that header's value.
//! From anyone else the header is ignored: a client cannot name its own
//! source. The quota is a GCRA shared by every replica through Redis, as
//! the per-user limit ([`crate::ratelimit`]), under keys
//! `fs:{sale}:src:<source>`; it is charged only for joins whose proof
//! passed, so a refused proof still costs Redis nothing.

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderName};
use ipnet::IpNet;

use crate::ratelimit::{Decision, RateLimiter};

/// The key kind of source quotas.
const KIND: &str = "src";

/// Longest header value taken as a source; a longer one is cut, so a
/// client behind a proxy cannot grow the limiter's keys without bound.
const MAX_SOURCE_LEN: usize = 128;

/// One sale's per-source quota of joins; cheap to clone.
#[derive(Clone)]
pub struct SourceBudget {
    limiter: RateLimiter,
    header: Option<HeaderName>,
    trusted: Vec<IpNet>,
}

impl SourceBudget {
    /// A budget charging `limiter` (its policy is the budget), taking the
    /// source from `header` when a peer in `trusted` sets it.
    pub fn new(limiter: RateLimiter, header: Option<HeaderName>, trusted: Vec<IpNet>) -> Self {
        Self {
            limiter: limiter.counting(KIND),
            header,
            trusted,
        }
    }

    /// The source of a request from `peer` (unknown when the server did
    /// not say) with `headers`.
    pub fn source(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> String {
        let vouched = peer.is_some_and(|peer| self.trusted.iter().any(|net| net.contains(&peer)));
        if vouched
            && let Some(value) = self
                .header
                .as_ref()
                .and_then(|name| headers.get(name))
                .and_then(|value| value.to_str().ok())
                .map(str::trim)
                .filter(|value| !value.is_empty())
        {
            let end = value.floor_char_boundary(MAX_SOURCE_LEN);
            return format!("h:{}", &value[..end]);
        }
        peer.map_or_else(|| "unknown".to_owned(), |peer| format!("ip:{peer}"))
    }

    /// Decides one join of `source` in `sale`, charging the shared quota
    /// when it is let through.
    pub fn check(&self, sale: &str, source: &str) -> Decision {
        self.limiter.check(sale, source)
    }

    /// Forgets idle sources (call now and then, as for the user limiter).
    pub fn prune_local(&self) {
        self.limiter.prune_local();
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use axum::http::HeaderValue;

    use super::*;
    use crate::ratelimit::{Charges, Policy, Settings};

    fn budget(burst: u32) -> SourceBudget {
        let policy = Policy {
            rate: NonZeroU32::MIN,
            burst: NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN),
        };
        SourceBudget::new(
            RateLimiter::new(None, Settings::new(policy), Charges::default()),
            Some(HeaderName::from_static("x-ja4")),
            vec!["10.0.0.0/8".parse().unwrap_or_else(|_| IpNet::default())],
        )
    }

    fn with_fingerprint(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert("x-ja4", value);
        }
        headers
    }

    #[test]
    fn the_header_counts_only_from_a_trusted_proxy() {
        let budget = budget(1);
        let headers = with_fingerprint("t13d1516h2_8daaf6152771");
        let proxy: IpAddr = [10, 1, 2, 3].into();
        let client: IpAddr = [203, 0, 113, 7].into();
        assert_eq!(
            budget.source(Some(proxy), &headers),
            "h:t13d1516h2_8daaf6152771"
        );
        assert_eq!(budget.source(Some(client), &headers), "ip:203.0.113.7");
        assert_eq!(budget.source(Some(proxy), &HeaderMap::new()), "ip:10.1.2.3");
        assert_eq!(budget.source(None, &headers), "unknown");
        let long = with_fingerprint(&"a".repeat(500));
        assert_eq!(budget.source(Some(proxy), &long).len(), 2 + MAX_SOURCE_LEN);
    }

    #[test]
    fn one_source_shares_one_quota_whatever_its_accounts() {
        let budget = budget(3);
        let allowed = (0..10)
            .filter(|_| budget.check("s1", "ip:203.0.113.7").allowed)
            .count();
        assert_eq!(allowed, 3);
        assert!(budget.check("s1", "ip:203.0.113.8").allowed);
    }
}
