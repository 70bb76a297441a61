//! Leaving Redis as found: benchmarks and tests remove the keys they made.

use redis::AsyncCommands;

/// Deletes (UNLINK) every key matching `pattern`, found with SCAN so a
/// shared Redis is never blocked; returns how many went.
pub async fn unlink_matching(url: &str, pattern: &str) -> redis::RedisResult<usize> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let keys: Vec<String> = {
        let mut iter: redis::AsyncIter<String> = conn.scan_match(pattern).await?;
        let mut keys = Vec::new();
        while let Some(key) = iter.next_item().await {
            keys.push(key?);
        }
        keys
    };
    for chunk in keys.chunks(1_000) {
        let _: () = conn.unlink(chunk).await?;
    }
    Ok(keys.len())
}
