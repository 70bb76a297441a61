//! The standby region on the local stack (`e2e/local/stack up region-b`):
//! each region's Secret leads to its own stores, B's Redis follows A's,
//! MirrorMaker 2 copies A's order topics into B's Kafka partition for
//! partition, and the global endpoint sends buyers to B only while A fails
//! its health check. `e2e/local/stack test` starts
//! region B; without it these tests fail and say how to start it.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, http::StatusCode, routing::get};
use flashsale_e2e::{
    faults,
    kafka::create_topic,
    reach::Reach,
    region::{self, Checks, Regions},
    same_store, stack,
    stores::Stores,
    wait::poll_until,
};
use rdkafka::{
    ClientConfig, Message,
    consumer::{BaseConsumer, Consumer},
    producer::{FutureProducer, FutureRecord},
};
use redis::AsyncCommands;
use tokio::net::TcpListener;

const POLL: Duration = Duration::from_millis(50);

#[tokio::test]
async fn each_regions_stores_secret_leads_to_that_regions_stores() -> anyhow::Result<()> {
    let regions = Regions::from_env()?;
    let client = flashsale_e2e::kube::client().await?;
    // Region A: its own Redis, the stack's PostgreSQL and Kafka.
    let a = Stores::discover_in(&client, "flashsale-region-a", Reach::ServiceIp).await?;
    same_store::redis(&a.here.redis, &regions.a_redis).await?;
    same_store::database(&a.here.database, &stack::postgres_url()?).await?;
    same_store::kafka(&a.here.kafka_brokers, &regions.a_kafka).await?;
    // Region B: all three its own.
    let b = Stores::discover_in(&client, "flashsale-region-b", Reach::ServiceIp).await?;
    same_store::redis(&b.here.redis, &regions.b_redis).await?;
    same_store::database(&b.here.database, &regions.b_database).await?;
    same_store::kafka(&b.here.kafka_brokers, &regions.b_kafka).await?;
    Ok(())
}

#[tokio::test]
async fn region_b_redis_is_a_read_only_replica_that_follows_region_a() -> anyhow::Result<()> {
    let regions = Regions::from_env()?;
    let mut a = redis::Client::open(regions.a_redis.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut b = redis::Client::open(regions.b_redis.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut b)
        .await?;
    assert!(info.contains("role:slave"), "{info}");
    assert!(info.contains("master_link_status:up"), "{info}");

    let key = format!("fs:{{{}}}:stock", stack::unique_name("region"));
    let _: () = a.set_ex(&key, 42, 60).await?;
    let followed = Instant::now();
    poll_until(
        "region B's Redis to hold what A's was given",
        Duration::from_secs(10),
        POLL,
        || {
            let (mut b, key) = (b.clone(), key.clone());
            async move {
                let value: Option<i64> = b.get(&key).await.map_err(|e| e.to_string())?;
                if value == Some(42) {
                    Ok(())
                } else {
                    Err(format!("B holds {value:?}"))
                }
            }
        },
    )
    .await?;
    println!("B held A's write after {:?}", followed.elapsed());
    // A replica refuses writes until a failover promotes it.
    let refused: redis::RedisResult<()> = b.set(&key, 7).await;
    let code = refused.as_ref().err().and_then(redis::RedisError::code);
    assert_eq!(code, Some("READONLY"), "{refused:?}");
    let _: () = a.del(&key).await?;
    Ok(())
}

#[tokio::test]
async fn mirror_maker_copies_region_a_orders_into_region_b_partition_for_partition()
-> anyhow::Result<()> {
    let regions = Regions::from_env()?;
    // A topic of the pattern MirrorMaker copies (`failover.*`), on A only:
    // MirrorMaker creates it in B.
    let topic = format!("failover.{}", stack::unique_name("mirror"));
    create_topic(&regions.a_kafka, &topic, 3).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &regions.a_kafka)
        .set("acks", "all")
        .create()?;
    let mut sent = Vec::new();
    for n in 0..12 {
        let key = format!("order-{n}");
        let partition = n % 3;
        producer
            .send(
                FutureRecord::to(&topic)
                    .key(&key)
                    .payload(&key)
                    .partition(partition),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
        sent.push((partition, key));
    }
    let sent_at = Instant::now();

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &regions.b_kafka)
        .set("group.id", stack::unique_name("mirror-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("topic.metadata.refresh.interval.ms", "500")
        .create()?;
    let consumer = Arc::new(consumer);
    // MirrorMaker looks for new topics every 5 s.
    poll_until(
        "MirrorMaker to create the topic in region B",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let (consumer, topic) = (consumer.clone(), topic.clone());
            async move {
                let metadata = consumer
                    .fetch_metadata(Some(&topic), Duration::from_secs(2))
                    .map_err(|e| e.to_string())?;
                let partitions = metadata
                    .topics()
                    .first()
                    .filter(|t| t.error().is_none())
                    .map_or(0, |t| t.partitions().len());
                if partitions == 3 {
                    Ok(())
                } else {
                    Err(format!("{partitions} partitions in B"))
                }
            }
        },
    )
    .await?;
    consumer.subscribe(&[&topic])?;
    let mut received: Vec<(i32, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.len() < sent.len() && Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message?;
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            received.push((message.partition(), key));
        }
    }
    println!(
        "{} of {} records mirrored within {:?}",
        received.len(),
        sent.len(),
        sent_at.elapsed()
    );
    received.sort();
    sent.sort();
    assert_eq!(received, sent, "B's copy differs from what A was sent");
    Ok(())
}

/// A stand-in gateway on its own loopback address: answers `/` with its
/// region's name and `/readyz` with 200 while `ready` holds, 503 after.
struct Gateway {
    traffic: SocketAddr,
    ready: Arc<AtomicBool>,
}

async fn gateway(
    ip: Ipv4Addr,
    health: TcpListener,
    region: &'static str,
) -> anyhow::Result<Gateway> {
    let ready = Arc::new(AtomicBool::new(true));
    let traffic = TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), 0)).await?;
    let address = traffic.local_addr()?;
    let app = Router::new().route("/", get(move || async move { region }));
    tokio::spawn(async move { axum::serve(traffic, app).await });
    let flag = ready.clone();
    let health_app = Router::new().route(
        "/readyz",
        get(move || {
            let flag = flag.clone();
            async move {
                if flag.load(Ordering::SeqCst) {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(health, health_app).await });
    Ok(Gateway {
        traffic: address,
        ready,
    })
}

/// One port free on both loopback addresses, for the gateways' `/readyz`
/// (the endpoint checks the same port on every gateway, as on the ops port).
async fn health_listeners(a: Ipv4Addr, b: Ipv4Addr) -> anyhow::Result<(TcpListener, TcpListener)> {
    for _ in 0..20 {
        let first = TcpListener::bind(SocketAddr::new(IpAddr::V4(a), 0)).await?;
        let port = first.local_addr()?.port();
        if let Ok(second) = TcpListener::bind(SocketAddr::new(IpAddr::V4(b), port)).await {
            return Ok((first, second));
        }
    }
    anyhow::bail!("no port free on both {a} and {b}")
}

/// Which region the endpoint sent a request to, by the answer's body.
async fn served_by(http: &reqwest::Client, endpoint: &str) -> Result<String, String> {
    let response = http.get(endpoint).send().await.map_err(|e| e.to_string())?;
    let header = response
        .headers()
        .get("x-flashsale-region")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.text().await.map_err(|e| e.to_string())?;
    // The header names the server HAProxy chose; the body, who answered.
    match header {
        Some(server) if server == format!("region-{body}") => Ok(body),
        other => Err(format!(
            "answered {body:?} with X-Flashsale-Region {other:?}"
        )),
    }
}

/// Polls until the endpoint's answers come from `region`.
async fn until_served_by(
    http: &reqwest::Client,
    endpoint: &str,
    region: &str,
) -> Result<(), flashsale_e2e::wait::Timeout> {
    poll_until(
        &format!("the endpoint to send buyers to region {region}"),
        Duration::from_secs(10),
        POLL,
        || async {
            match served_by(http, endpoint).await? {
                served if served == region => Ok(()),
                served => Err(format!("still served by {served}")),
            }
        },
    )
    .await
}

#[tokio::test]
async fn the_global_endpoint_sends_buyers_to_b_only_while_a_fails_its_health_check()
-> anyhow::Result<()> {
    let regions = Regions::from_env()?;
    let _exclusive = faults::exclusive().await;
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3));
    let (health_a, health_b) = health_listeners(ip_a, ip_b).await?;
    let health_port = health_a.local_addr()?.port();
    let a = gateway(ip_a, health_a, "a").await?;
    let b = gateway(ip_b, health_b, "b").await?;
    let checks = Checks {
        interval: Duration::from_millis(200),
        fall: 2,
        rise: 2,
        health_port,
    };
    region::point_endpoint(&a.traffic.to_string(), &b.traffic.to_string(), checks).await?;
    poll_until(
        "both regions UP at the endpoint",
        Duration::from_secs(20),
        POLL,
        || async {
            let servers = region::endpoint_servers(&regions.endpoint_stats)
                .await
                .map_err(|e| e.to_string())?;
            if servers.len() == 2 && servers.iter().all(|s| s.status == "UP") {
                Ok(())
            } else {
                Err(format!("{servers:?}"))
            }
        },
    )
    .await?;

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    // A healthy: no buyer reaches B (no false failover).
    for _ in 0..20 {
        assert_eq!(
            served_by(&http, &regions.endpoint).await.as_deref(),
            Ok("a")
        );
    }

    a.ready.store(false, Ordering::SeqCst);
    let failed = Instant::now();
    until_served_by(&http, &regions.endpoint, "b").await?;
    let switched = failed.elapsed();
    // Once switched, every buyer goes to B.
    for _ in 0..10 {
        assert_eq!(
            served_by(&http, &regions.endpoint).await.as_deref(),
            Ok("b")
        );
    }
    let servers = region::endpoint_servers(&regions.endpoint_stats).await?;
    assert!(
        servers
            .iter()
            .any(|s| s.name == "region-a" && s.status.starts_with("DOWN")),
        "{servers:?}"
    );

    a.ready.store(true, Ordering::SeqCst);
    let recovered = Instant::now();
    until_served_by(&http, &regions.endpoint, "a").await?;
    println!(
        "checks every {:?}, down after {}, up after {}: to B in {switched:?}, back to A in {:?}",
        checks.interval,
        checks.fall,
        checks.rise,
        recovered.elapsed()
    );
    Ok(())
}
