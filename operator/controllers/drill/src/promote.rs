//! The standby region's Redis in an active failover run. Until a failover
//! it is the primary's read-only replica, and the standby's inventory
//! stands by on it; a region failover's runbook promotes it, so the run
//! does once buyers lose the primary region, and fences the primary's
//! Redis (has it follow the promoted one), so the primary region's
//! inventory stands by and sells nothing the standby sells. Once the
//! primary took buyers back (or however else the run ends) the run hands
//! the role back with Redis's own coordinated failover: the standby holds
//! its writes until the primary has applied every sale it made, so no
//! unit sold in either region is sold again. Each promotion is on the
//! run's record before it happens, so the replica that ends the run, this
//! one or the next after a restart, knows what to give back.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;

use super::{guard::Guard, readings};
use flashsale_api::chaosdrill::{FailoverCheck, Promotion, ReplicationLag};
use flashsale_observe::standby::{self, RedisRole};

/// How long one Redis command of a promotion or a restore may take.
const REDIS_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the standby may hold its writes while the primary catches up
/// in the switchback; Redis gives the handover up after it.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(10);

/// How often a switchback step is checked on while it completes.
const SWITCH_EVERY: Duration = Duration::from_millis(100);

/// Promotes each standby Redis `spec` names for promotion, recording each
/// on the run's record first, then reads what each held and fences its
/// primary (after every promotion, so a primary that cannot be reached
/// delays no other promotion); how many, or why one could not be.
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
    let mut promoted = Vec::new();
    for lag in &spec.replication {
        let Some(secret) = &lag.promote_redis_url_secret_ref else {
            continue;
        };
        let url = readings::secret_text(client, namespace, secret).await?;
        let role = standby::redis_role(&url, REDIS_TIMEOUT)
            .await
            .map_err(|err| format!("the standby's Redis {}: {err}", lag.name))?;
        let RedisRole::Replica {
            of: follows,
            offset: standby_offset,
            ..
        } = role
        else {
            return Err(format!(
                "the standby's Redis {} is a primary already, not a replica",
                lag.name
            ));
        };
        guard.update(|progress| {
            progress.record.promoted.push(Promotion {
                name: lag.name.clone(),
                follows,
                promoted_at: None,
                fenced_at: None,
                restored_at: None,
                primary_held: None,
                standby_held: None,
                behind_bytes: None,
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
        promoted.push((lag, url, standby_offset));
    }
    for (lag, url, standby_offset) in &promoted {
        let (standby_held, (primary_held, primary_offset)) =
            held_units(client, namespace, lag, (url, sale)).await;
        let behind = primary_offset
            .map(|primary| primary.saturating_sub(*standby_offset))
            .and_then(|bytes| i64::try_from(bytes).ok());
        // After the reads: following the standby replaces the primary's
        // data with the standby's, which is what the reads compare.
        let fenced = fence(client, namespace, lag, url)
            .await
            .then(|| MicroTime(now()));
        guard.update(|progress| {
            let record = &mut progress.record;
            if let Some(p) = record.promoted.iter_mut().rfind(|p| p.name == lag.name) {
                (p.primary_held, p.standby_held) = (primary_held, standby_held);
                (p.behind_bytes, p.fenced_at) = (behind, fenced);
            }
            record.oversold_units = oversold(&record.promoted);
        });
    }
    Ok(promoted.len())
}

/// Has the primary's Redis follow the promoted standby at `standby_url`,
/// so the primary region's inventory stands by: whether it does. A
/// primary that cannot be reached (lost with its region) is fenced at the
/// switchback instead; the log says why.
async fn fence(client: &Client, namespace: &str, lag: &ReplicationLag, standby_url: &str) -> bool {
    let fenced = async {
        let secret = lag
            .redis_url_secret_ref
            .as_ref()
            .ok_or("no primary Redis named")?;
        let primary = readings::secret_text(client, namespace, secret).await?;
        let standby = standby::redis_address(standby_url).map_err(|err| err.to_string())?;
        standby::redis_replicaof(&primary, Some(&standby), REDIS_TIMEOUT)
            .await
            .map_err(|err| err.to_string())
    };
    match fenced.await {
        Ok(()) => true,
        Err(why) => {
            tracing::warn!(
                replication = lag.name,
                error = why,
                "cannot fence the primary's Redis; the switchback will"
            );
            false
        }
    }
}

/// The drill SKU's units the promoted standby (at `standby_url`) and its
/// primary held, read right after the promotion: the standby first, before
/// its inventory's next check (every 500 ms) lets it sell, then the
/// primary, whose gateways lost buyers, with the primary's replication
/// offset (how far its stream went, which the standby's offset before the
/// promotion is compared with). `None` for one that could not be read,
/// such as a primary lost with its region; the log says why.
async fn held_units(
    client: &Client,
    namespace: &str,
    lag: &ReplicationLag,
    (standby_url, sale): (&str, &str),
) -> (Option<i64>, (Option<i64>, Option<u64>)) {
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
    let primary_url = match &lag.redis_url_secret_ref {
        Some(secret) => readings::secret_text(client, namespace, secret)
            .await
            .map_err(|why| {
                tracing::warn!(
                    replication = lag.name,
                    error = why,
                    "cannot read the primary's held units"
                );
            })
            .ok(),
        None => None,
    };
    let Some(primary_url) = primary_url else {
        return (standby, (None, None));
    };
    let held = read(primary_url.clone(), "primary").await;
    let offset = match standby::redis_role(&primary_url, REDIS_TIMEOUT).await {
        Ok(RedisRole::Primary { offset }) => Some(offset),
        _ => None,
    };
    (standby, (held, offset))
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

/// Hands each Redis of `promoted` not yet restored back to its primary
/// (the switchback), marking it restored at `now`; the sentence that says
/// so, or `None` when there was nothing to restore.
pub async fn restore(
    client: &Client,
    namespace: &str,
    spec: Option<&FailoverCheck>,
    (promoted, now): (&mut [Promotion], Timestamp),
) -> Option<String> {
    let mut said = Vec::new();
    for promotion in promoted.iter_mut().filter(|p| p.restored_at.is_none()) {
        let lag = spec.and_then(|spec| {
            spec.replication
                .iter()
                .find(|lag| lag.name == promotion.name)
        });
        let restored = match lag {
            None => Err("the drill no longer names it".to_owned()),
            Some(lag) => match urls(client, namespace, lag).await {
                Ok(urls) => switch_back(urls, promotion).await,
                Err(why) => Err(why),
            },
        };
        let (name, follows) = (&promotion.name, &promotion.follows);
        said.push(match restored {
            Ok(()) => {
                promotion.restored_at = Some(MicroTime(now));
                format!(
                    "the standby's Redis {name}, promoted for the failover, follows {follows} \
                     again, which had caught up with its sales"
                )
            }
            Err(why) => format!(
                "the standby's Redis {name} could not hand the sale back to {follows} ({why}): \
                 once that Redis follows it and has caught up, run FAILOVER TO {} on it",
                follows.replace(':', " ")
            ),
        });
    }
    (!said.is_empty()).then(|| said.join("; "))
}

/// The URLs of `lag`'s primary and standby Redis.
async fn urls(
    client: &Client,
    namespace: &str,
    lag: &ReplicationLag,
) -> Result<(String, String), String> {
    let (Some(primary), Some(standby)) =
        (&lag.redis_url_secret_ref, &lag.promote_redis_url_secret_ref)
    else {
        return Err("the drill names no primary and standby Redis for it".to_owned());
    };
    Ok((
        readings::secret_text(client, namespace, primary).await?,
        readings::secret_text(client, namespace, standby).await?,
    ))
}

/// Hands the role back from the promoted standby to the primary, from
/// wherever an earlier attempt (or the fence) left them: the primary
/// follows the standby and catches up, then Redis's `FAILOVER` moves the
/// role with the standby's writes held, so the standby follows the
/// primary at `promotion.follows` with nothing either sold left out.
async fn switch_back(
    (primary, standby): (String, String),
    promotion: &Promotion,
) -> Result<(), String> {
    let role = |url: String, whose: &'static str| async move {
        standby::redis_role(&url, REDIS_TIMEOUT)
            .await
            .map_err(|err| format!("reading the {whose}'s role: {err}"))
    };
    if matches!(
        role(standby.clone(), "standby").await?,
        RedisRole::Replica { .. }
    ) {
        return Ok(());
    }
    let standby_at = standby::redis_address(&standby).map_err(|err| err.to_string())?;
    match role(primary.clone(), "primary").await? {
        // An earlier switchback promoted the primary and ended before the
        // standby followed it.
        RedisRole::Primary { .. } if promotion.fenced_at.is_some() => {
            return standby::redis_replicaof(&standby, Some(&promotion.follows), REDIS_TIMEOUT)
                .await
                .map_err(|err| err.to_string());
        }
        // Fenced: it follows the standby already.
        RedisRole::Replica { of, .. } if of == standby_at => {}
        // Never fenced: what the primary gave out since the promotion is
        // replaced by the standby's record (the divergence counted it).
        _ => standby::redis_replicaof(&primary, Some(&standby_at), REDIS_TIMEOUT)
            .await
            .map_err(|err| format!("fencing the primary's Redis: {err}"))?,
    }
    until(
        CATCH_UP_WITHIN,
        "the primary's Redis to sync with the standby's",
        || {
            let primary = primary.clone();
            async move {
                Ok(matches!(
                    standby::redis_role(&primary, REDIS_TIMEOUT).await,
                    Ok(RedisRole::Replica { linked: true, .. })
                ))
            }
        },
    )
    .await?;
    standby::redis_hand_over(
        &standby,
        &promotion.follows,
        (CATCH_UP_WITHIN, REDIS_TIMEOUT),
    )
    .await
    .map_err(|err| format!("handing over: {err}"))?;
    // Redis gives the handover up after CATCH_UP_WITHIN; a margin for the
    // last step.
    until(
        CATCH_UP_WITHIN + Duration::from_secs(2),
        "the handover",
        || {
            let standby = standby.clone();
            async move {
                match standby::redis_role(&standby, REDIS_TIMEOUT).await {
                    Ok(RedisRole::Replica { .. }) => Ok(true),
                    Ok(RedisRole::Primary { .. }) | Err(_) => Ok(false),
                }
            }
        },
    )
    .await
}

/// Waits until `done` says so, checking every [`SWITCH_EVERY`] for at most
/// `within`.
async fn until<F: Future<Output = Result<bool, String>>>(
    within: Duration,
    what: &str,
    mut done: impl FnMut() -> F,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if done().await? {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "waited {} for {what}",
                flashsale_api::Duration(within)
            ));
        }
        tokio::time::sleep(SWITCH_EVERY).await;
    }
}

/// Of `orders`, those acknowledged in the run whose reservation no primary
/// Redis of `promoted` holds once handed back: units its stock would give
/// out again. Read only when every promotion was handed back.
///
/// # Errors
/// A Secret or a Redis could not be read.
pub async fn unreserved(
    client: &Client,
    namespace: &str,
    spec: Option<&FailoverCheck>,
    (promoted, sale, orders): (&[Promotion], &str, Vec<String>),
) -> Result<Vec<String>, String> {
    let mut left = orders;
    for promotion in promoted {
        let secret = spec
            .and_then(|spec| spec.replication.iter().find(|l| l.name == promotion.name))
            .and_then(|lag| lag.redis_url_secret_ref.as_ref())
            .ok_or_else(|| format!("the drill no longer names the Redis {}", promotion.name))?;
        let url = readings::secret_text(client, namespace, secret).await?;
        left = standby::redis_unreserved_orders(&url, sale, &left, REDIS_TIMEOUT)
            .await
            .map_err(|err| err.to_string())?;
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promotion(name: &str, held: (Option<i64>, Option<i64>)) -> Promotion {
        Promotion {
            name: name.to_owned(),
            follows: "127.0.0.1:16381".to_owned(),
            promoted_at: None,
            fenced_at: None,
            restored_at: None,
            primary_held: held.0,
            standby_held: held.1,
            behind_bytes: None,
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
