//! An active failover run's synthetic buyer: orders one unit of the drill
//! SKU through the global endpoint every [`ORDER_EVERY`], each order as a
//! buyer of its own (the drill SKU sells one unit per buyer), with a token
//! signed with the sale's drill key ([`flashsale_drill_buyer`]), and
//! tallies which region acknowledged, refused or never answered each. So a
//! failover is judged on orders that went down the real order path, not on
//! pages: a standby that answers but cannot take orders shows as refusals.

use std::collections::BTreeMap;

use flashsale_api::chaosdrill::DrillOrders;
use flashsale_drill_buyer::DrillTokenError;
use flashsale_observe::standby::{OrderAnswer, StandbyReadError};
use jiff::Timestamp;

/// How often the buyer orders: 5 orders a second, a load no gateway
/// notices, enough to date a failover to a fifth of a second.
pub const ORDER_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// How long each token is valid: an order answered later counts as
/// unanswered anyway.
const TOKEN_SECONDS: i64 = 300;

/// The lane of the buyers that order at the standby's gateways directly.
pub const DIRECT_LANE: &str = "direct-";

/// Signs the tokens of one run's buyers of one sale.
pub struct Signer {
    key: Vec<u8>,
    sale_id: String,
    run: String,
}

impl Signer {
    /// A signer with the sale's drill `key`, for the sale with id
    /// `sale_id`, naming its buyers after the run `run`.
    ///
    /// # Errors
    /// The key is too short to sign with.
    pub fn new(key: Vec<u8>, sale_id: String, run: String) -> Result<Self, DrillTokenError> {
        let signer = Self { key, sale_id, run };
        // Refused here once, not on every order.
        signer.sign(("", 0), Timestamp::UNIX_EPOCH)?;
        Ok(signer)
    }

    /// Whose orders the run's buyer places: the sale's id and the prefix
    /// of every buyer id it signs for.
    pub fn buyers(&self) -> (&str, String) {
        (&self.sale_id, format!("drill:{}:", self.run))
    }

    /// The `n`th buyer of the run's `lane` (a prefix of the buyer's own
    /// part: `""` through the endpoint, [`DIRECT_LANE`] at the standby) and
    /// its token, valid from `now`.
    ///
    /// # Errors
    /// Signing failed.
    pub fn sign(
        &self,
        (lane, n): (&str, u64),
        now: Timestamp,
    ) -> Result<(String, String), DrillTokenError> {
        let buyer = format!("{}{lane}{n}", self.buyers().1);
        let expires = u64::try_from(now.as_second().saturating_add(TOKEN_SECONDS)).unwrap_or(0);
        let token = flashsale_drill_buyer::sign(&self.key, &self.sale_id, &buyer, expires)?;
        Ok((buyer, token))
    }
}

/// What became of one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// A gateway of `region` acknowledged it as `order_id`.
    Acknowledged {
        /// The region stamped on the answer.
        region: String,
        /// The order's id.
        order_id: String,
    },
    /// A gateway of `region` answered it with another status.
    Refused {
        /// The region stamped on the answer.
        region: String,
        /// The status it answered.
        status: u16,
    },
    /// No gateway answered: the endpoint's own error page, nothing within
    /// the bound, or a token that could not be signed.
    Unanswered,
}

impl Fate {
    /// The order as an answer on a [`crate::failover::Timeline`] judged
    /// against `primary`: served only when acknowledged.
    pub fn answer(&self, primary: &str) -> crate::failover::Answer {
        use crate::failover::Answer;
        match self {
            Self::Acknowledged { region, .. } if region == primary => Answer::Primary,
            Self::Acknowledged { region, .. } => Answer::Other(region.clone()),
            Self::Refused { .. } | Self::Unanswered => Answer::Unserved,
        }
    }

    /// Classifies the endpoint's answer to an order.
    pub fn of(answer: Result<OrderAnswer, StandbyReadError>) -> Self {
        match answer {
            Ok(OrderAnswer {
                status: 201,
                region: Some(region),
                order_id: Some(order_id),
            }) => Self::Acknowledged { region, order_id },
            Ok(OrderAnswer {
                status,
                region: Some(region),
                ..
            }) => Self::Refused { region, status },
            _ => Self::Unanswered,
        }
    }
}

/// The orders so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Orders placed.
    pub placed: u64,
    /// Acknowledged order ids, per region, in the order answered.
    pub acknowledged: BTreeMap<String, Vec<String>>,
    /// Refusals per region, and their statuses with how many of each.
    pub refused: BTreeMap<String, BTreeMap<u16, u64>>,
    /// Orders no gateway answered.
    pub unanswered: u64,
}

impl Tally {
    /// Takes one order's fate.
    pub fn see(&mut self, fate: Fate) {
        self.placed += 1;
        match fate {
            Fate::Acknowledged { region, order_id } => {
                self.acknowledged.entry(region).or_default().push(order_id);
            }
            Fate::Refused { region, status } => {
                *self
                    .refused
                    .entry(region)
                    .or_default()
                    .entry(status)
                    .or_default() += 1;
            }
            Fate::Unanswered => self.unanswered += 1,
        }
    }

    /// The ids this tally and `other` acknowledged, per region.
    pub fn acknowledged_with(&self, other: Option<&Self>) -> BTreeMap<String, Vec<String>> {
        let mut all = self.acknowledged.clone();
        for (region, ids) in other.iter().flat_map(|o| &o.acknowledged) {
            all.entry(region.clone())
                .or_default()
                .extend(ids.iter().cloned());
        }
        all
    }

    /// The counts, for the run's record.
    pub fn record(&self) -> DrillOrders {
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let len = |n: usize| count(u64::try_from(n).unwrap_or(u64::MAX));
        DrillOrders {
            placed: count(self.placed),
            acknowledged: self
                .acknowledged
                .iter()
                .map(|(region, ids)| (region.clone(), len(ids.len())))
                .collect(),
            refused: self
                .refused
                .iter()
                .map(|(region, statuses)| (region.clone(), count(statuses.values().sum())))
                .collect(),
            unanswered: count(self.unanswered),
            lost: None,
        }
    }

    /// The tally of the orders placed `placed` ("through it") in a clause:
    /// "the drill buyer's 50 orders through it: acknowledged 30 by a, 15 by
    /// b; refused 3 by b (503 ×3); 2 unanswered".
    pub fn sentence(&self, placed: &str) -> String {
        let acknowledged: Vec<String> = self
            .acknowledged
            .iter()
            .map(|(region, ids)| format!("{} by {region}", ids.len()))
            .collect();
        let refused: Vec<String> = self
            .refused
            .iter()
            .map(|(region, statuses)| {
                let statuses: Vec<String> = statuses
                    .iter()
                    .map(|(status, n)| format!("{status} ×{n}"))
                    .collect();
                let n: u64 = self.refused[region].values().sum();
                format!("{n} by {region} ({})", statuses.join(", "))
            })
            .collect();
        let mut parts = vec![if acknowledged.is_empty() {
            "none acknowledged".to_owned()
        } else {
            format!("acknowledged {}", acknowledged.join(", "))
        }];
        if !refused.is_empty() {
            parts.push(format!("refused {}", refused.join(", ")));
        }
        if self.unanswered > 0 {
            parts.push(format!("{} unanswered", self.unanswered));
        }
        format!(
            "the drill buyer's {} orders {placed}: {}",
            self.placed,
            parts.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, region: Option<&str>, order_id: Option<&str>) -> OrderAnswer {
        OrderAnswer {
            status,
            region: region.map(str::to_owned),
            order_id: order_id.map(str::to_owned),
        }
    }

    #[test]
    fn only_an_order_a_gateway_created_is_acknowledged() {
        let acked = Fate::of(Ok(answer(201, Some("a"), Some("o1"))));
        assert_eq!(
            acked,
            Fate::Acknowledged {
                region: "a".to_owned(),
                order_id: "o1".to_owned()
            }
        );
        // A gateway's refusal, whatever its status, names its region.
        for status in [200, 409, 429, 503] {
            let fate = Fate::of(Ok(answer(status, Some("b"), None)));
            assert_eq!(
                fate,
                Fate::Refused {
                    region: "b".to_owned(),
                    status
                }
            );
        }
        // A 201 without an order id is not an order anyone could find.
        assert_eq!(
            Fate::of(Ok(answer(201, Some("a"), None))),
            Fate::Refused {
                region: "a".to_owned(),
                status: 201
            }
        );
        // The endpoint's own 503 names no region.
        assert_eq!(Fate::of(Ok(answer(503, None, None))), Fate::Unanswered);
        // On a timeline, only an acknowledged order is served.
        use crate::failover::Answer;
        assert_eq!(acked.answer("a"), Answer::Primary);
        assert_eq!(acked.answer("b"), Answer::Other("a".to_owned()));
        let refused = Fate::Refused {
            region: "a".to_owned(),
            status: 503,
        };
        assert_eq!(refused.answer("a"), Answer::Unserved);
        let timeout = StandbyReadError::Timeout {
            what: "order".to_owned(),
            timeout: std::time::Duration::from_secs(2),
        };
        assert_eq!(Fate::of(Err(timeout)), Fate::Unanswered);
    }

    #[test]
    fn the_tally_counts_every_order_once_by_who_answered_it() {
        let mut tally = Tally::default();
        for (n, region) in ["a", "a", "b"].iter().enumerate() {
            tally.see(Fate::Acknowledged {
                region: (*region).to_owned(),
                order_id: format!("o{n}"),
            });
        }
        for status in [503, 503, 409] {
            tally.see(Fate::Refused {
                region: "b".to_owned(),
                status,
            });
        }
        tally.see(Fate::Unanswered);
        let record = tally.record();
        assert_eq!(record.placed, 7);
        assert_eq!(record.acknowledged["a"], 2);
        assert_eq!(record.acknowledged["b"], 1);
        assert_eq!(record.refused["b"], 3);
        assert_eq!(record.unanswered, 1);
        assert_eq!(tally.acknowledged["a"], ["o0", "o1"]);
        assert_eq!(
            tally.sentence("through it"),
            "the drill buyer's 7 orders through it: acknowledged 2 by a, 1 by b; refused 3 by b \
             (409 ×1, 503 ×2); 1 unanswered"
        );
        assert_eq!(
            Tally::default().sentence("through it"),
            "the drill buyer's 0 orders through it: none acknowledged"
        );
    }

    #[test]
    fn the_orders_acknowledged_through_both_lanes_are_counted_per_region() {
        let lane = |region: &str, ids: &[&str]| Tally {
            acknowledged: [(
                region.to_owned(),
                ids.iter().map(|id| (*id).to_owned()).collect(),
            )]
            .into(),
            ..Tally::default()
        };
        let endpoint = lane("a", &["ord-1"]);
        let merged = endpoint.acknowledged_with(Some(&lane("b", &["ord-2"])));
        assert_eq!(merged["a"], ["ord-1"]);
        assert_eq!(merged["b"], ["ord-2"]);
        let same = endpoint.acknowledged_with(Some(&lane("a", &["ord-3"])));
        assert_eq!(same["a"], ["ord-1", "ord-3"]);
        assert_eq!(endpoint.acknowledged_with(None), endpoint.acknowledged);
    }

    #[test]
    fn each_order_is_a_buyer_of_its_own_whose_token_the_sale_accepts() -> anyhow::Result<()> {
        let key = vec![7u8; flashsale_drill_buyer::MIN_KEY_BYTES];
        let signer = Signer::new(
            key.clone(),
            "ns.sale.1234abcd".to_owned(),
            "run1".to_owned(),
        )?;
        let now = Timestamp::from_second(1_800_000_000)?;
        let (first, token) = signer.sign(("", 1), now)?;
        let (second, _) = signer.sign(("", 2), now)?;
        assert_eq!(first, "drill:run1:1");
        assert_eq!(
            signer.buyers(),
            ("ns.sale.1234abcd", "drill:run1:".to_owned())
        );
        assert_ne!(first, second);
        // The standby's lane is under the run's prefix, apart from the
        // endpoint's.
        let (direct, _) = signer.sign((DIRECT_LANE, 1), now)?;
        assert_eq!(direct, "drill:run1:direct-1");
        let checker = flashsale_drill_buyer::Checker::new(&key, "ns.sale.1234abcd")?;
        assert_eq!(checker.buyer(&token, 1_800_000_000)?.sub, first);
        // Another sale's gateways refuse it.
        let other = flashsale_drill_buyer::Checker::new(&key, "ns.other.1234abcd")?;
        assert!(other.buyer(&token, 1_800_000_000).is_err());
        // A key too short is refused when the run starts, not per order.
        assert!(Signer::new(vec![7u8; 8], "s".to_owned(), "r".to_owned()).is_err());
        Ok(())
    }
}
