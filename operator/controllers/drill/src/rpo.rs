//! An active failover run's orders, looked up by id in both regions'
//! databases once the primary took buyers back: the RPO (orders the
//! primary region acknowledged that the standby's database lacks, once
//! replication drained) and lost orders (acknowledged by any region, in
//! neither database). Replication is given `drainWithin` to bring the
//! primary's orders over; the lookup ends as soon as nothing is missing.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use flashsale_api::chaosdrill::{FailoverCheck, OrdersCheck};
use flashsale_kit::clock::Clock;
use flashsale_observe::orders::stored_orders;
use kube::Client;

use crate::{failover::Buyers, readings};

/// How long one database read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the databases are read again while orders are missing.
const READ_EVERY: Duration = Duration::from_millis(500);

/// How many missing ids a sentence names.
const NAMED: usize = 3;

/// What the databases held of the acknowledged orders.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    /// Orders the primary region acknowledged.
    pub primary_acknowledged: usize,
    /// Orders any region acknowledged.
    pub acknowledged: usize,
    /// Of the primary's, those the standby's database lacks.
    pub missing_in_standby: BTreeSet<String>,
    /// Of all, those neither database holds.
    pub lost: BTreeSet<String>,
    /// The run's orders either database holds, acknowledged or not.
    pub stored: BTreeSet<String>,
    /// From the first read to the last.
    pub took: Duration,
}

impl Lookup {
    /// Compares the acknowledged orders, per region, with what each
    /// database holds.
    pub fn of(
        acknowledged: &BTreeMap<String, Vec<String>>,
        primary: &str,
        (in_primary, in_standby): (&BTreeSet<String>, &BTreeSet<String>),
    ) -> Self {
        let primary_ids = acknowledged.get(primary).map_or(&[][..], Vec::as_slice);
        let all = acknowledged.values().flatten();
        Self {
            primary_acknowledged: primary_ids.len(),
            acknowledged: acknowledged.values().map(Vec::len).sum(),
            missing_in_standby: primary_ids
                .iter()
                .filter(|id| !in_standby.contains(*id))
                .cloned()
                .collect(),
            lost: all
                .filter(|id| !in_primary.contains(*id) && !in_standby.contains(*id))
                .cloned()
                .collect(),
            stored: in_primary.union(in_standby).cloned().collect(),
            took: Duration::ZERO,
        }
    }

    /// The RPO in orders.
    pub fn rpo(&self) -> i64 {
        i64::try_from(self.missing_in_standby.len()).unwrap_or(i64::MAX)
    }

    /// Lost orders.
    pub fn lost(&self) -> i64 {
        i64::try_from(self.lost.len()).unwrap_or(i64::MAX)
    }

    /// Nothing missing anywhere.
    fn complete(&self) -> bool {
        self.missing_in_standby.is_empty() && self.lost.is_empty()
    }

    /// The lookup in a clause, against `max_rpo`.
    pub fn sentence(&self, max_rpo: i64) -> String {
        let took = flashsale_api::Duration(self.took);
        let rpo = if self.missing_in_standby.is_empty() {
            format!(
                "the standby's database held all {} orders the primary region acknowledged \
                 (RPO 0, maxRPO {max_rpo}; looked up in {took})",
                self.primary_acknowledged
            )
        } else {
            format!(
                "the standby's database lacked {} of the {} orders the primary region \
                 acknowledged after {took} of draining (RPO {}, maxRPO {max_rpo}; {})",
                self.missing_in_standby.len(),
                self.primary_acknowledged,
                self.rpo(),
                named(&self.missing_in_standby)
            )
        };
        let lost = if self.lost.is_empty() {
            format!("none of the {} acknowledged orders lost", self.acknowledged)
        } else {
            format!(
                "{} of the {} acknowledged orders are in neither region's database ({})",
                self.lost.len(),
                self.acknowledged,
                named(&self.lost)
            )
        };
        format!("{rpo}; {lost}")
    }
}

/// Some ids of `ids`, and how many more.
pub fn named<'a>(ids: impl IntoIterator<Item = &'a String>) -> String {
    let ids: Vec<&str> = ids.into_iter().map(String::as_str).collect();
    let shown = &ids[..ids.len().min(NAMED)];
    match ids.len().saturating_sub(NAMED) {
        0 => shown.join(", "),
        more => format!("{}, and {more} more", shown.join(", ")),
    }
}

/// Reads both databases until the standby's holds every order the
/// primary acknowledged and every acknowledged order is somewhere, or
/// `drainWithin` passed; what they held then.
///
/// # Errors
/// A database URL's Secret or a database could not be read.
pub async fn look_up(
    (client, clock): (&Client, &dyn Clock),
    namespace: &str,
    check: &OrdersCheck,
    (buyers, acknowledged): (&Buyers, &BTreeMap<String, Vec<String>>),
) -> Result<Lookup, String> {
    let url = |secret| readings::secret_text(client, namespace, secret);
    let primary_url = url(&check.primary_database_url_secret_ref).await?;
    let standby_url = url(&check.standby_database_url_secret_ref).await?;
    let read = |url: String, whose: &'static str| async move {
        stored_orders(&url, &buyers.sale_id, &buyers.prefix, READ_TIMEOUT)
            .await
            .map_err(|err| format!("the {whose} region's order database: {err}"))
    };
    let start = clock.monotonic();
    loop {
        let (in_primary, in_standby) = tokio::try_join!(
            read(primary_url.clone(), "primary"),
            read(standby_url.clone(), "standby")
        )?;
        let mut lookup = Lookup::of(acknowledged, &buyers.primary, (&in_primary, &in_standby));
        lookup.took = clock.monotonic().saturating_sub(start);
        if lookup.complete() || lookup.took >= check.drain_within.0 {
            return Ok(lookup);
        }
        tokio::time::sleep(READ_EVERY).await;
    }
}

/// The `orders` check of `failover`, when the run looks its orders up.
pub fn check(failover: Option<&FailoverCheck>) -> Option<&OrdersCheck> {
    failover.and_then(|f| f.orders.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn acknowledged() -> BTreeMap<String, Vec<String>> {
        [
            (
                "a".to_owned(),
                vec!["a1".to_owned(), "a2".to_owned(), "a3".to_owned()],
            ),
            ("b".to_owned(), vec!["b1".to_owned(), "b2".to_owned()]),
        ]
        .into()
    }

    #[test]
    fn the_rpo_counts_the_primarys_orders_the_standby_lacks_and_lost_ones_are_in_neither() {
        let acked = acknowledged();
        // B has every order: RPO 0, nothing lost.
        let all = ids(&["a1", "a2", "a3", "b1", "b2"]);
        let whole = Lookup::of(&acked, "a", (&ids(&["a1", "a2", "a3"]), &all));
        assert_eq!((whole.rpo(), whole.lost()), (0, 0));
        assert!(whole.complete());
        assert_eq!(
            whole.sentence(0),
            "the standby's database held all 3 orders the primary region acknowledged (RPO 0, \
             maxRPO 0; looked up in 0s); none of the 5 acknowledged orders lost"
        );
        // Mirroring stalled: A has its orders, B lacks two of them, and one
        // of B's own never reached any database.
        let stalled = Lookup::of(
            &acked,
            "a",
            (&ids(&["a1", "a2", "a3"]), &ids(&["a1", "b1"])),
        );
        assert_eq!(stalled.missing_in_standby, ids(&["a2", "a3"]));
        assert_eq!(stalled.lost, ids(&["b2"]));
        assert_eq!(
            stalled.sentence(1),
            "the standby's database lacked 2 of the 3 orders the primary region acknowledged \
             after 0s of draining (RPO 2, maxRPO 1; a2, a3); 1 of the 5 acknowledged orders \
             are in neither region's database (b2)"
        );
        // An order of A's in B's database only is not lost, and rows of
        // unacknowledged orders count for nothing.
        let elsewhere = Lookup::of(&acked, "a", (&ids(&["a1", "x"]), &all));
        assert_eq!((elsewhere.rpo(), elsewhere.lost()), (0, 0));
        // No order acknowledged: nothing to miss.
        let none = Lookup::of(&BTreeMap::new(), "a", (&ids(&[]), &ids(&[])));
        assert_eq!((none.primary_acknowledged, none.rpo()), (0, 0));
    }

    #[test]
    fn a_sentence_names_a_few_missing_orders_and_counts_the_rest() {
        assert_eq!(named(&ids(&["o1", "o2"])), "o1, o2");
        assert_eq!(
            named(&ids(&["o1", "o2", "o3", "o4", "o5"])),
            "o1, o2, o3, and 2 more"
        );
    }
}
