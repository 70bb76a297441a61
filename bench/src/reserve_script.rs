//! The seeds' design as a baseline: the inventory's reserve script called
//! straight on Redis, one reservation (a batch of one) per call, as a
//! client with its own Lua would. The floor of every path that reserves.

use std::{future::Future, pin::Pin, sync::Arc};

use flashsale_runtime::RedisConnection;
use inventory::{
    coalesce::{BatchItem, batch_invocation},
    keys::SaleKeys,
};

/// One call of a load driver.
pub type Call = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// An operation for the load drivers: call `n` reserves one unit of `sku`
/// of `sale` for a buyer of its own, under request id `<tag>-<n>`, with one
/// script call; anything but `reserved` is an error.
pub fn reserve_calls(
    conn: &RedisConnection,
    sale: &str,
    sku: &str,
    tag: String,
) -> impl Fn(u64) -> Call + Send + Sync + 'static {
    let script = Arc::new(redis::Script::new(inventory::store::RESERVE_LOCAL_LUA));
    let (conn, keys, sku) = (conn.clone(), SaleKeys::new(sale), sku.to_owned());
    move |n| {
        let (mut conn, script, keys, sku) =
            (conn.clone(), script.clone(), keys.clone(), sku.clone());
        let id = format!("{tag}-{n}");
        Box::pin(async move {
            let item = BatchItem {
                user: format!("u{id}"),
                quantity: 1,
                reservation_id: id.clone(),
                request_id: id,
                amount_minor: 3600,
                ttl_ms: 3_600_000,
            };
            let replies: Vec<Vec<String>> = batch_invocation(&script, &keys, &sku, &[item])
                .invoke_async(&mut conn)
                .await?;
            let reply = replies.first().and_then(|r| r.first());
            anyhow::ensure!(reply.map(String::as_str) == Some("reserved"), "{replies:?}");
            Ok(())
        })
    }
}
