//! The adaptive concurrency limit against a deliberately slow inventory: a
//! stand-in that serves at most `CAPACITY` reservations at a time, each
//! taking `SERVICE`, so its latency grows with the queue in front of it
//! (latency ≈ SERVICE × max(1, n / CAPACITY)). The limiter must find that
//! capacity from latency alone and refuse the excess at once with 503,
//! keeping accepted orders near the uncongested latency.

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Json, Router, extract::State, http::StatusCode, routing::post};
use common::{Running, create_topic, http, token};
use flashsale_e2e::stack;
use gateway::{config::GatewayConfig, server::SwitchSource};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

const CAPACITY: usize = 8;
const SERVICE: Duration = Duration::from_millis(20);
const CLIENTS: usize = 64;

#[derive(Clone)]
struct Slow {
    capacity: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
    most_waiting: Arc<AtomicUsize>,
}

async fn reserve(
    State(slow): State<Slow>,
    Json(request): Json<Value>,
) -> Result<(StatusCode, Json<Value>), StatusCode> {
    let record = serve_one(&slow, &request).await?;
    Ok((StatusCode::CREATED, Json(record)))
}

/// A batch, as the real inventory serves one: each member is a reservation
/// of its own, waiting for capacity like one that came alone.
async fn reserve_batch(
    State(slow): State<Slow>,
    Json(batch): Json<Value>,
) -> Result<Json<Value>, StatusCode> {
    let members = batch["reservations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let records =
        futures::future::try_join_all(members.iter().map(|m| serve_one(&slow, m))).await?;
    let results: Vec<Value> = records
        .into_iter()
        .map(|record| json!({"status": 201, "reservation": record}))
        .collect();
    Ok(Json(json!({"results": results})))
}

/// One reservation, once capacity allows: its record.
async fn serve_one(slow: &Slow, request: &Value) -> Result<Value, StatusCode> {
    let queued = slow.waiting.fetch_add(1, Ordering::SeqCst) + 1;
    slow.most_waiting.fetch_max(queued, Ordering::SeqCst);
    let permit = slow
        .capacity
        .acquire()
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    tokio::time::sleep(SERVICE).await;
    drop(permit);
    slow.waiting.fetch_sub(1, Ordering::SeqCst);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let expires = jiff::Timestamp::now().as_millisecond() + 60_000;
    Ok(json!({
            "id": id,
            "state": "reserved",
            "expires_at_ms": expires,
            "user": request["user"],
            "sku": request["sku"],
            "quantity": request["quantity"],
            "amount_minor": request["amountMinor"],
            "request_id": request["requestId"],
    }))
}

/// The slow stand-in inventory on a free port: its state and base URL, and
/// the serving task.
async fn serve_slow_inventory()
-> anyhow::Result<(Slow, String, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let slow = Slow {
        capacity: Arc::new(Semaphore::new(CAPACITY)),
        waiting: Arc::default(),
        most_waiting: Arc::default(),
    };
    let router = Router::new()
        .route("/v1/sales/{sale}/reservations", post(reserve))
        .route("/v1/sales/{sale}/reservation-batches", post(reserve_batch))
        .with_state(slow.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let inventory = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((slow, inventory, server))
}

/// A gateway in front of `inventory`, with an adaptive concurrency limit
/// and a rate limit too high to matter, on a topic of its own.
async fn start_gateway(inventory: &str) -> anyhow::Result<Running> {
    let sale = stack::unique_name("gw-slow");
    let brokers = stack::kafka_brokers()?;
    let topic = stack::unique_name("gw-slow-orders");
    create_topic(&brokers, &topic).await?;
    let config: GatewayConfig = serde_json::from_value(json!({
        "sale": sale,
        "currency": "CNY",
        "items": [{"sku": "A", "priceMinor": 100}],
        "rateLimit": {"perUserPerSecond": 100000, "burst": 100000},
        "concurrency": {"minLimit": 2, "maxLimit": 500},
        "requestTimeoutMs": 5000,
    }))?;
    Running::start(config, inventory, &brokers, &topic, SwitchSource::None).await
}

/// The median latency of 20 orders placed one at a time.
async fn uncongested_latency(url: &str) -> anyhow::Result<Duration> {
    let mut alone = Vec::new();
    for n in 0..20 {
        let started = Instant::now();
        let response = http()
            .post(url)
            .bearer_auth(token("alone"))
            .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": format!("alone{n}")}))
            .send()
            .await?;
        anyhow::ensure!(
            response.status().as_u16() == 201,
            "HTTP {}",
            response.status()
        );
        alone.push(started.elapsed());
    }
    alone.sort();
    Ok(alone[alone.len() / 2])
}

/// One client ordering again as soon as it is answered until `until`: when
/// and how long each accepted order took, and how many were shed with 503.
async fn order_back_to_back(
    url: String,
    c: usize,
    until: Instant,
) -> anyhow::Result<(Vec<(Instant, Duration)>, u32)> {
    let (client, bearer) = (http(), token(&format!("c{c}")));
    let (mut accepted, mut shed) = (Vec::new(), 0_u32);
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let started = Instant::now();
        let response = client
            .post(&url)
            .bearer_auth(&bearer)
            .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": format!("k{n}")}))
            .send()
            .await?;
        match response.status().as_u16() {
            201 => accepted.push((started, started.elapsed())),
            503 => {
                anyhow::ensure!(
                    response.headers().contains_key("retry-after"),
                    "503 without Retry-After"
                );
                shed += 1;
                // Clients back off before trying again (shorter than the
                // Retry-After of 1 s, to keep the pressure on).
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => anyhow::bail!("unexpected HTTP {other}: {}", response.text().await?),
        }
    }
    anyhow::Ok((accepted, shed))
}

#[tokio::test]
async fn the_limit_finds_a_slow_inventorys_capacity_and_sheds_the_rest() -> anyhow::Result<()> {
    let (slow, inventory, server) = serve_slow_inventory().await?;
    let gateway = start_gateway(&inventory).await?;

    // Uncongested: one order at a time.
    let url = format!("{}/api/v1/orders", gateway.url);
    let uncongested = uncongested_latency(&url).await?;

    // 64 clients, each ordering again as soon as it is answered, for 6 s.
    let until = Instant::now() + Duration::from_secs(6);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(order_back_to_back(url.clone(), c, until)))
        .collect();
    let (mut latencies, mut shed) = (Vec::new(), 0);
    let settled = until - Duration::from_secs(3);
    // Count the inventory's queue from the settled phase on.
    tokio::time::sleep_until(settled.into()).await;
    slow.most_waiting.store(0, Ordering::SeqCst);
    for client in clients {
        let (accepted, refused) = client.await??;
        shed += refused;
        // The last 3 s, once the limit has settled.
        latencies.extend(
            accepted
                .into_iter()
                .filter(|(at, _)| *at >= settled)
                .map(|(_, took)| took),
        );
    }
    latencies.sort();
    let limit = gateway
        .metric("gateway_concurrency_limit")
        .unwrap_or(f64::NAN);
    let median = latencies
        .get(latencies.len() / 2)
        .copied()
        .unwrap_or_default();
    let queued = slow.most_waiting.load(Ordering::SeqCst);
    println!(
        "slow inventory (capacity {CAPACITY}, {SERVICE:?} each), {CLIENTS} clients: limit {limit}; \
         at most {queued} requests at the inventory at once once settled (unlimited: {CLIENTS}); \
         {} orders in the last 3 s, median {median:?} vs {uncongested:?} uncongested; {shed} shed with 503",
        latencies.len(),
    );
    assert!(shed > 0, "the excess was refused at once");
    assert!(
        (2.0..=4.0 * CAPACITY as f64).contains(&limit),
        "the limit settles near the capacity of {CAPACITY}, not at the client count: {limit}"
    );
    assert!(
        queued <= 4 * CAPACITY,
        "the queue in front of the inventory stays near its capacity, not the client count: {queued}"
    );
    // Loose on purpose: this process also runs the 64 clients on 2 shared cores.
    assert!(
        median < uncongested * 3,
        "accepted orders stay near the uncongested latency: {median:?} vs {uncongested:?}"
    );
    assert!(
        latencies.len() > 100,
        "the inventory kept serving: {}",
        latencies.len()
    );
    server.abort();
    Ok(())
}
