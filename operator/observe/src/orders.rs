//! Looks orders up in a region's order database, as the order-writer
//! writes it (`docs/design/order-writer.md`): which of one sale's orders,
//! by buyer prefix, a database holds. An active failover run compares them
//! with the orders its buyer was acknowledged, for the RPO and for lost
//! orders. One connection per read, bounded by its timeout.

use std::{collections::BTreeSet, time::Duration};

use sqlx::Connection;

use crate::standby::StandbyReadError;

/// The ids of the orders of sale `sale` whose buyer id starts with
/// `buyers`, in the order database at `url` (`postgres://` or
/// `mysql://`).
///
/// # Errors
/// The URL names neither family, the database cannot be reached or
/// queried, or it did not answer within `timeout`.
pub async fn stored_orders(
    url: &str,
    sale: &str,
    buyers: &str,
    timeout: Duration,
) -> Result<BTreeSet<String>, StandbyReadError> {
    let what = format!("the orders of sale {sale} in {}", redacted(url));
    let len = i32::try_from(buyers.chars().count()).unwrap_or(i32::MAX);
    // One query, in each family's placeholders.
    let (url, sql) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        (
            url.to_owned(),
            "SELECT order_id FROM orders WHERE sale = $1 AND left(user_id, $2) = $3",
        )
    } else if let Some(rest) = url
        .strip_prefix("mysql://")
        .or_else(|| url.strip_prefix("mariadb://"))
    {
        (
            format!("mysql://{rest}"),
            "SELECT order_id FROM orders WHERE sale = ? AND LEFT(user_id, ?) = ?",
        )
    } else {
        return Err(StandbyReadError::Failed {
            what,
            detail: "the URL is neither postgres:// nor mysql://".to_owned(),
        });
    };
    sqlx::any::install_default_drivers();
    let read = async {
        let mut conn = sqlx::AnyConnection::connect(&url).await?;
        let ids: Vec<String> = sqlx::query_scalar(sql)
            .bind(sale)
            .bind(len)
            .bind(buyers)
            .fetch_all(&mut conn)
            .await?;
        conn.close().await?;
        Ok::<_, sqlx::Error>(ids)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(ids)) => Ok(ids.into_iter().collect()),
        Ok(Err(err)) => Err(StandbyReadError::Failed {
            what,
            detail: err.to_string(),
        }),
        Err(_) => Err(StandbyReadError::Timeout { what, timeout }),
    }
}

/// The URL without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://…{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_in_a_message_keeps_its_host_and_loses_its_credentials() {
        assert_eq!(
            redacted("postgres://flashsale:s3cret@db.b.svc:5432/flashsale"),
            "postgres://…@db.b.svc:5432/flashsale"
        );
        assert_eq!(redacted("mysql://db:3306/x"), "mysql://db:3306/x");
    }

    #[tokio::test]
    async fn an_unknown_scheme_is_refused_with_a_sentence() {
        let err = stored_orders("redis://db:6379", "s", "drill:", Duration::from_secs(1))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("neither postgres:// nor mysql://"), "{err}");
    }
}
