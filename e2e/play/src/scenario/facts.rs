//! Reading what really happened, from the systems of record: the stock in
//! Redis, the order rows in PostgreSQL, Chaos Mesh objects and the
//! operator's Events in the apiserver.

use std::collections::BTreeMap;

use anyhow::Context;
use flashsale_controller_drill::chaos::Kind;
use inventory::keys::SaleKeys;
use k8s_openapi::api::core::v1::Event;
use kube::{
    Client,
    api::{Api, DynamicObject, ListParams},
};
use redis::AsyncCommands;

use super::{
    checks::{Row, Stock},
    plan::Item,
};

/// The systems of record, connected once: the checks read them again and
/// again while the last events land.
pub struct Records {
    redis: redis::aio::MultiplexedConnection,
    db: sqlx::PgPool,
}

impl Records {
    /// Connects to Redis and PostgreSQL.
    pub async fn connect(redis_url: &str, database_url: &str) -> anyhow::Result<Self> {
        let redis = redis::Client::open(redis_url)
            .context("Redis URL")?
            .get_multiplexed_async_connection()
            .await
            .context("connecting to Redis")?;
        let db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(database_url)
            .await
            .context("connecting to PostgreSQL")?;
        Ok(Self { redis, db })
    }

    /// Each item's stock as the inventory keeps it: the SKU's record
    /// (`stock`, `sold`) and its shards' `avail` and `held` counters.
    pub async fn stock(&self, sale_id: &str, items: &[Item]) -> anyhow::Result<Vec<Stock>> {
        let mut redis = self.redis.clone();
        let keys = SaleKeys::new(sale_id);
        let mut out = Vec::new();
        for item in items {
            let record: BTreeMap<String, i64> = redis
                .hgetall(keys.sku(&item.sku))
                .await
                .with_context(|| format!("reading {}", keys.sku(&item.sku)))?;
            let (mut available, mut held) = (0, 0);
            let shards = u32::try_from(item.shards).unwrap_or(1);
            for index in 0..shards {
                let shard = keys.shard(&item.sku, shards, index);
                let a: Option<i64> = redis.get(shard.avail()).await?;
                let h: Option<i64> = redis.get(shard.held()).await?;
                available += a.unwrap_or(0);
                held += h.unwrap_or(0);
            }
            out.push(Stock {
                sku: item.sku.clone(),
                stock: record.get("stock").copied().unwrap_or(0),
                sold: record.get("sold").copied().unwrap_or(0),
                available,
                held,
            });
        }
        Ok(out)
    }

    /// Every order row of the sale.
    pub async fn rows(&self, sale_id: &str) -> anyhow::Result<Vec<Row>> {
        let rows: Vec<(String, String, String, i32, String)> = sqlx::query_as(
            "SELECT order_id, idempotency_key, sku, quantity, status FROM orders WHERE sale = $1",
        )
        .bind(sale_id)
        .fetch_all(&self.db)
        .await
        .context("reading the sale's orders")?;
        Ok(rows
            .into_iter()
            .map(|(order_id, idempotency_key, sku, quantity, status)| Row {
                order_id,
                idempotency_key,
                sku,
                quantity: i64::from(quantity),
                status,
            })
            .collect())
    }
}

/// How many Chaos Mesh objects of each kind the drill could leave exist in
/// `namespace`.
pub async fn chaos_left(
    client: &Client,
    namespace: &str,
) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut left = BTreeMap::new();
    for kind in Kind::EXPERIMENTS
        .into_iter()
        .chain([Kind::Workflow, Kind::StatusCheck])
    {
        let resource = kind.resource();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let list = api
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing {}", resource.kind))?;
        left.insert(resource.kind.clone(), list.items.len());
    }
    Ok(left)
}

/// The Events of the objects whose uids are `uids` in `namespace`: for
/// each, its kind and every reason it was given, once per Event.
pub async fn events(
    client: &Client,
    namespace: &str,
    uids: &[String],
) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let list = events
        .list(&ListParams::default())
        .await
        .context("listing Events")?;
    let mut told: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for event in list.items {
        let about = &event.involved_object;
        // An earlier object of the same name has other uids.
        if about.uid.as_ref().is_some_and(|uid| uids.contains(uid)) {
            told.entry(about.kind.clone().unwrap_or_default())
                .or_default()
                .push(event.reason.unwrap_or_default());
        }
    }
    Ok(told)
}
