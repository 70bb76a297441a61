//! The Secret `flashsale-stack/stores` leads a run holding only a
//! kubeconfig to the stack's own stores and Prometheus, by either reach:
//! what it writes through them, the stack's addresses read back.

use flashsale_e2e::{
    kafka,
    reach::Reach,
    stack,
    stores::{Stores, Urls},
};
use redis::AsyncCommands;
use sqlx::{Connection, PgConnection};

#[tokio::test]
async fn the_stores_secret_leads_to_the_stacks_own_stores_by_either_reach() -> anyhow::Result<()> {
    let client = flashsale_e2e::kube::client().await?;
    for reach in [Reach::ServiceIp, Reach::Apiserver] {
        let stores = Stores::discover(&client, reach).await?;
        assert_eq!(
            stores.in_cluster,
            Urls {
                redis: stack::in_cluster::redis_url()?,
                database: stack::in_cluster::database_url()?,
                kafka_brokers: stack::in_cluster::kafka_brokers()?,
                prometheus: stack::in_cluster::prometheus_url()?,
            },
            "{reach:?}: the pods' addresses are the Secret's"
        );
        same_redis(&stores.here.redis).await?;
        same_database(&stores.here.database).await?;
        same_kafka(&stores.here.kafka_brokers).await?;
        let prometheus: prometheus_http_query::Client = stores.here.prometheus.parse()?;
        let up = prometheus.query("up").get().await?;
        assert!(
            up.data().as_vector().is_some_and(|v| !v.is_empty()),
            "{reach:?}: Prometheus at {} has no targets: {up:?}",
            stores.here.prometheus
        );
    }
    Ok(())
}

/// A key written at `url` is read back at the stack's Redis.
async fn same_redis(url: &str) -> anyhow::Result<()> {
    let key = format!("fs:{{{}}}:stores", stack::unique_name("smoke"));
    let mut there = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = there.set_ex(&key, url, 60).await?;
    let mut stack = redis::Client::open(stack::redis_url()?)?
        .get_multiplexed_async_connection()
        .await?;
    let read: Option<String> = stack.get(&key).await?;
    assert_eq!(read.as_deref(), Some(url), "Redis at {url}");
    let _: () = stack.del(&key).await?;
    Ok(())
}

/// The database at `url` is the stack's: the same cluster, the same
/// database.
async fn same_database(url: &str) -> anyhow::Result<()> {
    let identity = "SELECT system_identifier::text || '/' || current_database() \
                    FROM pg_control_system()";
    let mut there = PgConnection::connect(url).await?;
    let mut stack = PgConnection::connect(&stack::postgres_url()?).await?;
    let theirs: String = sqlx::query_scalar(identity).fetch_one(&mut there).await?;
    let ours: String = sqlx::query_scalar(identity).fetch_one(&mut stack).await?;
    assert_eq!(theirs, ours, "PostgreSQL at {url}");
    Ok(())
}

/// A topic created at `brokers` already exists at the stack's Kafka.
async fn same_kafka(brokers: &str) -> anyhow::Result<()> {
    let topic = stack::unique_name("stores");
    kafka::create_topic(brokers, &topic, 1).await?;
    let again = kafka::create_topic(&stack::kafka_brokers()?, &topic, 1).await;
    let refused = again.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        refused.to_lowercase().contains("already exists"),
        "Kafka at {brokers}: the stack's Kafka does not know {topic}: {refused:?}"
    );
    Ok(())
}
