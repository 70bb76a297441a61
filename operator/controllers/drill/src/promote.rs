//! The standby region's Redis in an active failover run. Until a failover
//! it is the primary's read-only replica, and the standby's inventory
//! stands by on it; a region failover's runbook promotes it, so the run
//! does once buyers lose the primary region, and has it follow the primary
//! again once the primary took buyers back, or however else the run ends.
//! Each promotion is on the run's record before it happens, so the replica
//! that ends the run, this one or the next after a restart, knows what to
//! give back.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;

use super::{guard::Guard, readings};
use flashsale_api::chaosdrill::{FailoverCheck, Promotion, ReplicationLag};
use flashsale_observe::standby;

/// How long one Redis command of a promotion or a restore may take.
const REDIS_TIMEOUT: Duration = Duration::from_secs(3);

/// Promotes each standby Redis `spec` names for promotion, recording each
/// on the run's record first; how many, or why one could not be.
///
/// # Errors
/// A Secret or a Redis could not be read, or Redis refused; those promoted
/// before stay on the record, to be restored.
pub async fn promote(
    client: &Client,
    (namespace, sale): (&str, &str),
    spec: &FailoverCheck,
    (guard, now): (&Guard, &(dyn Fn() -> Timestamp + Sync)),
) -> Result<usize, String> {
    let mut promoted = 0;
    for lag in &spec.replication {
        let Some(secret) = &lag.promote_redis_url_secret_ref else {
            continue;
        };
        let url = readings::secret_text(client, namespace, secret).await?;
        let follows = standby::redis_primary_of(&url, REDIS_TIMEOUT)
            .await
            .map_err(|err| format!("the standby's Redis {}: {err}", lag.name))?;
        guard.update(|progress| {
            progress.record.promoted.push(Promotion {
                name: lag.name.clone(),
                follows,
                promoted_at: None,
                restored_at: None,
                primary_held: None,
                standby_held: None,
            });
        });
        standby::redis_replicaof(&url, None, REDIS_TIMEOUT)
            .await
            .map_err(|err| format!("promoting the standby's Redis {}: {err}", lag.name))?;
        let at = MicroTime(now());
        guard.update(|progress| {
            if let Some(p) = progress
                .record
                .promoted
                .iter_mut()
                .rfind(|p| p.name == lag.name)
            {
                p.promoted_at = Some(at);
            }
        });
        let (standby_held, primary_held) = held_units(client, namespace, lag, (&url, sale)).await;
        guard.update(|progress| {
            let record = &mut progress.record;
            if let Some(p) = record.promoted.iter_mut().rfind(|p| p.name == lag.name) {
                (p.primary_held, p.standby_held) = (primary_held, standby_held);
            }
            record.oversold_units = oversold(&record.promoted);
        });
        promoted += 1;
    }
    Ok(promoted)
}

/// The drill SKU's units the promoted standby (at `standby_url`) and its
/// primary held, read right after the promotion: the standby first, before
/// its inventory's next check (every 500 ms) lets it sell, then the
/// primary, whose gateways lost buyers. `None` for one that could not be
/// read, such as a primary lost with its region; the log says why.
async fn held_units(
    client: &Client,
    namespace: &str,
    lag: &ReplicationLag,
    (standby_url, sale): (&str, &str),
) -> (Option<i64>, Option<i64>) {
    let units = (sale, flashsale_drill_buyer::SKU);
    let read = |url: String, whose: &'static str| async move {
        match standby::redis_held_units(&url, units, REDIS_TIMEOUT).await {
            Ok(held) => i64::try_from(held).ok(),
            Err(err) => {
                tracing::warn!(replication = lag.name, error = %err, "cannot read the {whose}'s held units");
                None
            }
        }
    };
    let standby = read(standby_url.to_owned(), "standby").await;
    let primary = match &lag.redis_url_secret_ref {
        Some(secret) => match readings::secret_text(client, namespace, secret).await {
            Ok(url) => read(url, "primary").await,
            Err(why) => {
                tracing::warn!(
                    replication = lag.name,
                    error = why,
                    "cannot read the primary's held units"
                );
                None
            }
        },
        None => None,
    };
    (standby, primary)
}

/// The units the promoted standbys did not know of, summed; `None` until
/// one was measured.
pub fn oversold(promoted: &[Promotion]) -> Option<i64> {
    promoted
        .iter()
        .filter_map(Promotion::diverged)
        .reduce(i64::saturating_add)
}

/// The stock divergence the promotions measured, in a clause, or `None`
/// when none was.
pub fn divergence(promoted: &[Promotion]) -> Option<String> {
    let said: Vec<String> = promoted
        .iter()
        .filter_map(|p| {
            let diverged = p.diverged()?;
            let (primary, standby) = (p.primary_held?, p.standby_held?);
            Some(format!(
                "the standby's Redis {} held {standby} drill units when promoted, the primary \
                 {primary}: {diverged} would be sold again",
                p.name
            ))
        })
        .collect();
    (!said.is_empty()).then(|| said.join("; "))
}

/// Has each Redis of `promoted` not yet restored follow its primary again,
/// marking it restored at `now`; the sentence that says so, or `None` when
/// there was nothing to restore.
pub async fn restore(
    client: &Client,
    namespace: &str,
    spec: Option<&FailoverCheck>,
    (promoted, now): (&mut [Promotion], Timestamp),
) -> Option<String> {
    let mut said = Vec::new();
    for promotion in promoted.iter_mut().filter(|p| p.restored_at.is_none()) {
        let secret = spec.and_then(|spec| {
            spec.replication
                .iter()
                .find(|lag| lag.name == promotion.name)
                .and_then(|lag| lag.promote_redis_url_secret_ref.as_ref())
        });
        let restored = match secret {
            None => Err("the drill no longer names it".to_owned()),
            Some(secret) => match readings::secret_text(client, namespace, secret).await {
                Ok(url) => standby::redis_replicaof(&url, Some(&promotion.follows), REDIS_TIMEOUT)
                    .await
                    .map_err(|err| err.to_string()),
                Err(why) => Err(why),
            },
        };
        let (name, follows) = (&promotion.name, &promotion.follows);
        said.push(match restored {
            Ok(()) => {
                promotion.restored_at = Some(MicroTime(now));
                format!(
                    "the standby's Redis {name}, promoted for the failover, follows {follows} again"
                )
            }
            Err(why) => format!(
                "the standby's Redis {name} could not follow {follows} again ({why}): have it \
                 follow by hand (REPLICAOF {})",
                follows.replace(':', " ")
            ),
        });
    }
    (!said.is_empty()).then(|| said.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promotion(name: &str, held: (Option<i64>, Option<i64>)) -> Promotion {
        Promotion {
            name: name.to_owned(),
            follows: "127.0.0.1:16381".to_owned(),
            promoted_at: None,
            restored_at: None,
            primary_held: held.0,
            standby_held: held.1,
        }
    }

    #[test]
    fn the_units_a_promoted_standby_did_not_know_of_are_what_it_would_sell_again() {
        // Caught up: nothing diverged.
        let caught_up = [promotion("inventory", (Some(42), Some(42)))];
        assert_eq!(oversold(&caught_up), Some(0));
        // Two units behind, said with both counts.
        let behind = [promotion("inventory", (Some(42), Some(40)))];
        assert_eq!(oversold(&behind), Some(2));
        assert_eq!(
            divergence(&behind).as_deref(),
            Some(
                "the standby's Redis inventory held 40 drill units when promoted, the primary 42: \
                 2 would be sold again"
            )
        );
        // A standby ahead (it sold once promoted, or the primary released
        // units meanwhile) oversold nothing.
        assert_eq!(
            oversold(&[promotion("inventory", (Some(40), Some(41)))]),
            Some(0)
        );
        // A primary lost with its region cannot be read: nothing measured.
        let unread = [promotion("inventory", (None, Some(40)))];
        assert_eq!((oversold(&unread), divergence(&unread)), (None, None));
        // Two promotions add up; an unread one counts for nothing.
        let two = [
            promotion("inventory", (Some(10), Some(7))),
            promotion("hot", (Some(5), Some(4))),
            promotion("cold", (None, None)),
        ];
        assert_eq!(oversold(&two), Some(4));
    }
}
