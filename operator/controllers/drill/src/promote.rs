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
use flashsale_api::chaosdrill::{FailoverCheck, Promotion};
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
    namespace: &str,
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
        promoted += 1;
    }
    Ok(promoted)
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
