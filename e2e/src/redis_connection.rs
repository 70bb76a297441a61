//! A Redis connection for tests, made as the workloads make theirs.

use std::time::Duration;

use flashsale_runtime::{RedisConnection, RedisTarget, RedisTimeouts};

/// A connection of its own to the Redis at `url` (one server or a cluster),
/// with 2 s for each answer: tests check algorithms on a busy machine.
pub async fn connect(url: &str) -> anyhow::Result<RedisConnection> {
    let timeouts = RedisTimeouts {
        response: Duration::from_secs(2),
        ..RedisTimeouts::default()
    };
    Ok(RedisConnection::connect(&url.parse::<RedisTarget>()?, timeouts).await?)
}
