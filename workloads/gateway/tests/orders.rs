//! Order intake through the gateway against a real inventory, Redis and
//! Kafka: an order is acknowledged once reserved, its event reaches Kafka
//! once through the inventory's outbox (later, if Kafka was down), and bad
//! input gets a 4xx JSON error.

mod common;

use std::time::Duration;

use common::{DRILL_KEY, Funnel, Options, drill_order, http, now_s, order, provider_pays, token};
use flashsale_e2e::{delay::DelayProxy, stack, wait::poll_until};
use gateway::{
    items::{FALLBACK, HEDGE_AFTER},
    server::SwitchSource,
};
use inventory::keys::SaleKeys;
use serde_json::{Value, json};

#[tokio::test]
async fn an_order_is_reserved_published_once_and_paid() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let gw = &funnel.gateway.url;
    let (status, body, headers) = order(gw, "alice", "A", "key-1", None).await?;
    assert_eq!(status, 201, "{body}");
    assert!(
        headers.contains_key("ratelimit"),
        "allowed answers carry RateLimit"
    );
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();
    assert!(order_id.starts_with("ord-"), "{body}");
    assert_eq!(body["amountMinor"], 1999);
    assert_eq!(funnel.available("A").await?, 99);

    let stored = funnel.events().await?;
    assert_eq!(stored.len(), 1, "exactly one event: {stored:?}");
    let event = &stored[0];
    assert_eq!(
        (
            event.order_id.as_str(),
            event.user_id.as_str(),
            event.sku.as_str()
        ),
        (order_id.as_str(), "alice", "A")
    );
    assert_eq!(
        event.reservation_id,
        body["reservationId"].as_str().unwrap_or_default()
    );

    // A client retry with the same key names the same order and holds no more stock.
    let (status, again, _) = order(gw, "alice", "A", "key-1", None).await?;
    assert_eq!(status, 201, "{again}");
    assert_eq!(again["orderId"], body["orderId"]);
    assert_eq!(funnel.available("A").await?, 99);

    // The buyer only starts a payment: what to pay, nothing confirmed.
    let pay = |user: &str| {
        http()
            .post(format!("{gw}/api/v1/orders/{order_id}/pay"))
            .bearer_auth(token(user))
            .send()
    };
    assert_eq!(pay("mallory").await?.status().as_u16(), 404);
    let started = pay("alice").await?;
    assert_eq!(started.status().as_u16(), 202);
    let started: Value = started.json().await?;
    assert_eq!(
        (
            &started["status"],
            &started["amountMinor"],
            &started["currency"]
        ),
        (&json!("awaiting_payment"), &json!(1999), &json!("CNY")),
        "{started}"
    );
    // The provider's callback pays it; a replay within the window is harmless.
    for _ in 0..2 {
        let (status, paid) = provider_pays(gw, &order_id, 1999, "CNY", now_s()).await?;
        assert_eq!((status, &paid["status"]), (200, &json!("paid")), "{paid}");
    }
    let after: Value = pay("alice").await?.json().await?;
    assert_eq!(after["status"], "paid");
    let kinds: Vec<String> = funnel
        .events()
        .await?
        .iter()
        .filter(|e| e.order_id == order_id)
        .map(|e| format!("{:?}", e.kind))
        .collect();
    // In any order: `paid` may overtake `created`, which waits in the
    // inventory's outbox (docs/design/inventory.md).
    assert_eq!(
        kinds.iter().filter(|k| *k == "Created").count(),
        1,
        "the retry did not publish again: {kinds:?}"
    );
    let paid = kinds.iter().filter(|k| *k == "Paid").count();
    assert!(paid >= 1 && paid + 1 == kinds.len(), "{kinds:?}");
    // Its producer is exported, and a healthy broker never had it replaced.
    assert_eq!(
        funnel
            .gateway
            .metric("gateway_kafka_producer_replacements_total"),
        Some(0.0)
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn kafka_unreachable_delays_the_event_not_the_order() -> anyhow::Result<()> {
    // A broker address nobody listens on, for the gateway and the
    // inventory's relay alike: every send fails at its bound.
    let funnel = Funnel::start(Options {
        brokers: Some("127.0.0.1:1".into()),
        config: json!({"requestTimeoutMs": 800}),
        ..Options::default()
    })
    .await?;
    let (status, body, _) = order(&funnel.gateway.url, "bob", "A", "k", None).await?;
    assert_eq!(status, 201, "acknowledged without Kafka: {body}");
    assert_eq!(funnel.available("A").await?, 99, "the unit is held");
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();
    let reservation = body["reservationId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    // The order's event waits in the inventory's outbox, taken by its
    // relay and not acknowledged.
    let keys = SaleKeys::new(&funnel.sale);
    let mut redis = redis::Client::open(stack::redis_url()?)?
        .get_multiplexed_async_connection()
        .await?;
    let outbox: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(keys.outbox())
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await?;
    let waiting: Vec<&[String]> = outbox.iter().map(|(_, f)| f.as_slice()).collect();
    let entry = ["kind", "created", "reservation", reservation.as_str()].map(str::to_owned);
    assert_eq!(waiting, [entry.as_slice()], "the order's event, once");

    // The relay comes back (the same replica, restarted) with Kafka
    // reachable: it publishes the event it held, once.
    funnel.inventory.stop();
    let store = inventory::store::Store::connect(&stack::redis_url()?).await?;
    let mut settings = flashsale_orders::ProducerSettings::new(stack::kafka_brokers()?);
    settings.topic = funnel.topic.clone();
    let producer = flashsale_orders::OrderProducer::new(&settings)?;
    let consumer = format!("funnel-{}", funnel.sale);
    let round =
        inventory::outbox::publish_round(&store, &producer, &funnel.sale, &consumer).await?;
    assert_eq!(
        (round.created, round.unsent, round.pending),
        (1, 0, 0),
        "{round:?}"
    );
    let published = funnel.events().await?;
    assert_eq!(
        published
            .iter()
            .map(|e| (e.kind, e.order_id.as_str(), e.user_id.as_str()))
            .collect::<Vec<_>>(),
        [(
            flashsale_orders::EventKind::Created,
            order_id.as_str(),
            "bob"
        )]
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn inventory_down_gives_503_within_the_deadline() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: json!({"requestTimeoutMs": 600}),
        ..Options::default()
    })
    .await?;
    funnel.inventory.stop();
    let started = std::time::Instant::now();
    let (status, body, _) = order(&funnel.gateway.url, "carol", "A", "k", None).await?;
    let took = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(
        took < Duration::from_secs(3),
        "answered within the budget plus slack: {took:?}"
    );
    assert!(funnel.events().await?.is_empty(), "nothing published");
    funnel.cleanup().await
}

#[tokio::test]
async fn sold_out_and_user_limit_are_409_with_their_codes() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        stock: 2,
        per_user_limit: 1,
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    assert_eq!(order(gw, "u1", "A", "a", None).await?.0, 201);
    let (status, body, _) = order(gw, "u1", "A", "b", None).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("user_limit")),
        "{body}"
    );
    assert_eq!(order(gw, "u2", "A", "a", None).await?.0, 201);
    let (status, body, _) = order(gw, "u3", "A", "a", None).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("sold_out")),
        "{body}"
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn bad_input_gets_a_4xx_json_error() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let client = http();
    let alice = token("alice");
    let mut cases = malformed_orders(&client, &funnel.gateway.url, &alice);
    cases.extend(orders_of_nothing(&client, &funnel.gateway.url, &alice));
    for (name, request, status, code) in cases {
        let response = request.send().await?;
        let got = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(
            (got, body["error"].as_str()),
            (status, Some(code)),
            "{name}: {body}"
        );
        assert!(
            body["message"].is_string(),
            "{name}: a message for people: {body}"
        );
    }
    assert_eq!(
        funnel.available("A").await?,
        100,
        "no bad request held stock"
    );
    assert!(funnel.events().await?.is_empty());
    funnel.cleanup().await
}

/// Every answer names the region that served it, refusals and unknown
/// routes too, so a client behind a global endpoint (and a failover drill)
/// sees which region it reached.
#[tokio::test]
async fn every_answer_names_the_region_that_served_it() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: json!({"region": "cn-east-1"}),
        ..Options::default()
    })
    .await?;
    let (client, url) = (http(), &funnel.gateway.url);
    let alice = token("alice");
    let mut cases = malformed_orders(&client, url, &alice);
    cases.extend([
        (
            "an order",
            client
                .post(format!("{url}/api/v1/orders"))
                .bearer_auth(&alice)
                .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": "k1"})),
            201,
            "",
        ),
        (
            "stock",
            client
                .get(format!("{url}/api/v1/items/A"))
                .bearer_auth(&alice),
            200,
            "",
        ),
        (
            "no such route",
            client.get(format!("{url}/nowhere")),
            404,
            "not_found",
        ),
    ]);
    for (name, request, status, _) in cases {
        let response = request.send().await?;
        assert_eq!(response.status().as_u16(), status, "{name}");
        assert_eq!(
            response.headers().get(flashsale_runtime::REGION_HEADER),
            Some(&reqwest::header::HeaderValue::from_static("cn-east-1")),
            "{name}"
        );
    }
    funnel.cleanup().await
}

/// A request the gateway must refuse: (case, request, expected status,
/// expected error code).
type BadRequest = (&'static str, reqwest::RequestBuilder, u16, &'static str);

/// Orders the gateway cannot read: no or a forged token, bodies that are
/// not JSON, not the order's shape, or too large.
fn malformed_orders(client: &reqwest::Client, gateway: &str, alice: &str) -> Vec<BadRequest> {
    let url = format!("{gateway}/api/v1/orders");
    vec![
        (
            "no token",
            client
                .post(&url)
                .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": "k"})),
            401,
            "missing_token",
        ),
        (
            "forged token",
            client
                .post(&url)
                .bearer_auth(format!("{alice}x"))
                .json(&json!({})),
            401,
            "invalid_token",
        ),
        (
            "invalid JSON",
            client
                .post(&url)
                .bearer_auth(alice)
                .header("content-type", "application/json")
                .body("{\"sku\":"),
            400,
            "invalid_json",
        ),
        (
            "wrong types",
            client
                .post(&url)
                .bearer_auth(alice)
                .json(&json!({"sku": 1, "quantity": "x"})),
            422,
            "invalid_json",
        ),
        (
            "not JSON",
            client.post(&url).bearer_auth(alice).body("sku=A"),
            415,
            "unsupported_media_type",
        ),
        (
            "huge body",
            client
                .post(&url)
                .bearer_auth(alice)
                .header("content-type", "application/json")
                .body(format!("{{\"sku\":\"{}\"}}", "A".repeat(64 * 1024))),
            413,
            "body_too_large",
        ),
    ]
}

/// Well-formed requests for what is not there or not allowed: an unknown
/// SKU, sale, route or order, a zero quantity, no idempotency key.
fn orders_of_nothing(client: &reqwest::Client, gateway: &str, alice: &str) -> Vec<BadRequest> {
    let url = format!("{gateway}/api/v1/orders");
    vec![
        (
            "unknown SKU",
            client
                .post(&url)
                .bearer_auth(alice)
                .json(&json!({"sku": "nope", "quantity": 1, "idempotencyKey": "k"})),
            404,
            "unknown_sku",
        ),
        (
            "zero quantity",
            client
                .post(&url)
                .bearer_auth(alice)
                .json(&json!({"sku": "A", "quantity": 0, "idempotencyKey": "k"})),
            400,
            "invalid_request",
        ),
        (
            "no idempotency key",
            client
                .post(&url)
                .bearer_auth(alice)
                .json(&json!({"sku": "A", "quantity": 1})),
            400,
            "invalid_request",
        ),
        (
            "other sale",
            client
                .post(&url)
                .bearer_auth(alice)
                .json(&json!({"sale": "other", "sku": "A", "quantity": 1, "idempotencyKey": "k"})),
            404,
            "unknown_sale",
        ),
        (
            "unknown route",
            client.get(format!("{gateway}/api/v1/nothing")),
            404,
            "not_found",
        ),
        (
            "bad order id",
            client
                .post(format!("{gateway}/api/v1/orders/zzz/pay"))
                .bearer_auth(alice),
            404,
            "unknown_order",
        ),
    ]
}

#[tokio::test]
async fn the_rate_limit_answers_429_with_the_ietf_fields() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: json!({"rateLimit": {"perUserPerSecond": 1, "burst": 3}}),
        ..Options::default()
    })
    .await?;
    let url = format!("{}/api/v1/items/A", funnel.gateway.url);
    let mut codes = Vec::new();
    let mut refused = None;
    for _ in 0..5 {
        let response = http().get(&url).bearer_auth(token("dave")).send().await?;
        codes.push(response.status().as_u16());
        if response.status().as_u16() == 429 {
            refused = Some((response.headers().clone(), response.json::<Value>().await?));
        }
    }
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    let (headers, body) = refused.ok_or_else(|| anyhow::anyhow!("no refusal"))?;
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["ratelimit-policy"], "\"user\";q=3;w=3");
    assert!(headers["ratelimit"].to_str()?.starts_with("\"user\";r=0;"));
    // Another user is not affected.
    let other = http().get(&url).bearer_auth(token("erin")).send().await?;
    assert_eq!(other.status().as_u16(), 200);
    assert!(
        funnel
            .gateway
            .metric("gateway_rate_limited_total")
            .unwrap_or(0.0)
            >= 2.0
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn item_status_is_cached_with_single_flight() -> anyhow::Result<()> {
    // The concurrency limit is not what is tested here: room for the burst.
    let funnel = Funnel::start(Options {
        config: json!({"concurrency": {"minLimit": 400, "maxLimit": 1000}}),
        ..Options::default()
    })
    .await?;
    let url = format!("{}/api/v1/items/A", funnel.gateway.url);
    let alice = token("alice");
    let requests = (0..200).map(|_| http().get(&url).bearer_auth(&alice).send());
    let answers = futures::future::join_all(requests).await;
    let mut ok = 0;
    for answer in answers {
        let answer = answer?;
        assert_eq!(answer.status().as_u16(), 200);
        let body: Value = answer.json().await?;
        assert_eq!(
            (body["status"].as_str(), body["available"].as_u64()),
            (Some("available"), Some(100))
        );
        ok += 1;
    }
    assert_eq!(ok, 200);
    let refreshes = funnel.gateway.metric(WAITED).unwrap_or(0.0);
    assert!(
        refreshes <= 2.0,
        "200 concurrent reads cost {refreshes} inventory reads"
    );
    // A change shows within the cache's TTL.
    assert_eq!(
        order(&funnel.gateway.url, "bob", "A", "k", None).await?.0,
        201
    );
    poll_until(
        "the new stock level",
        Duration::from_secs(3),
        Duration::from_millis(50),
        || async {
            let body: Value = http()
                .get(&url)
                .bearer_auth(&alice)
                .send()
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            if body["available"] == 99 {
                Ok(())
            } else {
                Err(body.to_string())
            }
        },
    )
    .await?;
    let unknown = http()
        .get(format!("{}/api/v1/items/ZZ", funnel.gateway.url))
        .bearer_auth(&alice)
        .send()
        .await?;
    assert_eq!(unknown.status().as_u16(), 404);
    funnel.cleanup().await
}

/// Stock reads of the item cache that readers waited for.
const WAITED: &str = "gateway_item_refreshes_total{mode=\"waited\"}";

/// With the inventory 50 ms away (a delay the test owns) and an item read
/// steadily, only the first read waits: each later refresh runs behind an
/// answer in the refresh-ahead window, hedged, and a change still shows
/// within the TTL and one refresh.
#[tokio::test]
async fn item_reads_never_wait_on_a_slow_inventory_while_read_steadily() -> anyhow::Result<()> {
    const TTL: Duration = Duration::from_millis(1_000);
    let funnel = Funnel::start(Options {
        config: json!({"itemCacheMs": TTL.as_millis() as u64}),
        ..Options::default()
    })
    .await?;
    let proxy = DelayProxy::start(&funnel.inventory.url).await?;
    let gateway = funnel.replica_via(&proxy.url, SwitchSource::None).await?;
    let url = format!("{}/api/v1/items/A", gateway.url);
    let read = || async {
        let answer = http().get(&url).bearer_auth(token("alice")).send().await?;
        anyhow::ensure!(answer.status() == 200, "HTTP {}", answer.status());
        let body: Value = answer.json().await?;
        body["available"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("no exact stock (stale or coarse): {body}"))
    };
    assert_eq!(read().await?, 100);
    assert_eq!(gateway.metric(WAITED), Some(1.0), "the first read waits");
    proxy.set_delay(Duration::from_millis(50));
    assert_eq!(
        order(&funnel.gateway.url, "bob", "A", "k", None).await?.0,
        201
    );

    // Read every 25 ms until three refreshes ran ahead. A read can only
    // wait when the reads left the refresh-ahead window (a quarter of the
    // TTL) empty: the machine paused the loop for longer than the window
    // less a refresh's budget. Such gaps are counted, not assumed away.
    let ahead = "gateway_item_refreshes_total{mode=\"ahead\"}";
    let may_miss = TTL / 4 - (HEDGE_AFTER + FALLBACK);
    let (mut gaps, mut last, mut seen_change) = (0.0, std::time::Instant::now(), false);
    let mut pace = tokio::time::interval(Duration::from_millis(25));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while gateway.metric(ahead).unwrap_or(0.0) < 3.0 {
        anyhow::ensure!(std::time::Instant::now() < deadline, "no refresh ahead");
        pace.tick().await;
        if last.elapsed() >= may_miss {
            gaps += 1.0;
        }
        last = std::time::Instant::now();
        seen_change |= read().await? == 99;
    }
    assert!(seen_change, "the order showed within the reads");
    let waited = gateway.metric(WAITED).unwrap_or(0.0);
    assert!(
        waited <= 1.0 + gaps,
        "{waited} reads waited with {gaps} gaps of {may_miss:?} in the reads"
    );
    assert!(
        gateway
            .metric("gateway_item_reads_hedged_total")
            .unwrap_or(0.0)
            >= 3.0,
        "every refresh through the 50 ms delay sent its hedge"
    );
    drop(gateway);
    funnel.cleanup().await
}

#[tokio::test]
async fn before_the_opening_orders_get_409_with_retry_after_and_cost_nothing() -> anyhow::Result<()>
{
    // Opens in 90 s, written with a non-UTC offset; the waiting room is on,
    // to show the window is checked before anyone is queued.
    let opens = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(90);
    let offset = jiff::tz::Offset::constant(8);
    let funnel = Funnel::start(Options {
        config: json!({
            "opensAt": opens.display_with_offset(offset).to_string(),
            "waitingRoom": {"enabled": true},
        }),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let (status, body, headers) = order(gw, "alice", "A", "early", None).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("sale_not_open")),
        "{body}"
    );
    let retry_after: u64 = headers
        .get("retry-after")
        .ok_or_else(|| anyhow::anyhow!("no Retry-After"))?
        .to_str()?
        .parse()?;
    assert!((1..=90).contains(&retry_after), "Retry-After {retry_after}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("opens at"), "{body}");
    assert!(
        !headers.contains_key("ratelimit"),
        "refused before the rate limit"
    );

    // Anonymous callers learn nothing about the sale: the token comes first.
    let anonymous = http()
        .post(format!("{gw}/api/v1/orders"))
        .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": "k"}))
        .send()
        .await?;
    assert_eq!(anonymous.status().as_u16(), 401);
    // Stock reads stay open.
    let item = http()
        .get(format!("{gw}/api/v1/items/A"))
        .bearer_auth(token("alice"))
        .send()
        .await?;
    assert_eq!(item.status().as_u16(), 200);

    assert_eq!(funnel.available("A").await?, 100, "no stock held");
    assert!(funnel.events().await?.is_empty(), "nothing published");
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_requests_total{route="/api/v1/orders",code="409"}"#),
        Some(1.0)
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn a_drill_buyer_orders_only_the_drill_sku_before_the_opening_too() -> anyhow::Result<()> {
    let opens = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(90);
    let funnel = Funnel::start(Options {
        config: json!({"opensAt": opens.to_string(), "waitingRoom": {"enabled": true}}),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let sale = (funnel.sale.as_str(), DRILL_KEY);
    let drill = flashsale_drill_buyer::SKU;

    // Before the opening, past the waiting room: reserved and published.
    let (status, body) = drill_order(gw, sale, "drill:failover:1", drill).await?;
    assert_eq!(status, 201, "{body}");
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();
    let published = funnel.events().await?;
    let event = published
        .iter()
        .find(|e| e.order_id == order_id)
        .ok_or_else(|| anyhow::anyhow!("{order_id} not published: {published:?}"))?;
    assert_eq!(
        (
            event.sku.as_str(),
            event.amount_minor,
            event.user_id.as_str()
        ),
        (drill, 0, "drill:failover:1")
    );
    assert_eq!(
        funnel.available(drill).await?,
        flashsale_drill_buyer::STOCK - 1
    );

    // The drill buyer buys nothing real; a buyer cannot buy the drill SKU.
    let (status, body) = drill_order(gw, sale, "drill:failover:2", "A").await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("drill_sku_only")),
        "{body}"
    );
    let (status, body, _) = order(gw, "alice", drill, "k", None).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_sku")),
        "{body}"
    );
    assert_eq!(funnel.available("A").await?, 100, "real stock untouched");

    // Only this sale's key, for this sale, and only to order.
    let forged = (sale.0, b"another-key-another-key-another-key!!".as_slice());
    let (status, body) = drill_order(gw, forged, "drill:failover:3", drill).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("invalid_token")),
        "{body}"
    );
    let elsewhere = ("shop.other-sale.0123abcd", DRILL_KEY);
    let (status, body) = drill_order(gw, elsewhere, "drill:failover:4", drill).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("invalid_token")),
        "{body}"
    );
    let expires = u64::try_from(now_s() + 3600)?;
    let drill_token = flashsale_drill_buyer::sign(DRILL_KEY, sale.0, "drill:failover:5", expires)?;
    let item = http()
        .get(format!("{gw}/api/v1/items/A"))
        .bearer_auth(drill_token)
        .send()
        .await?;
    assert_eq!(item.status().as_u16(), 401);

    // Counted apart from buyers' requests, so no SLO moves with a drill.
    let gateway = &funnel.gateway;
    for (code, count) in [("201", 1.0), ("403", 1.0), ("401", 2.0)] {
        let series = format!(r#"gateway_drill_orders_total{{code="{code}"}}"#);
        assert_eq!(gateway.metric(&series), Some(count), "{series}");
    }
    let route = r#"route="/api/v1/orders""#;
    assert_eq!(
        gateway.metric(&format!(r#"gateway_requests_total{{{route},code="201"}}"#)),
        None
    );
    assert_eq!(
        gateway.metric(&format!(r#"gateway_requests_total{{{route},code="404"}}"#)),
        Some(1.0),
        "a buyer's order of the drill SKU is a buyer's request"
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn after_the_closing_new_orders_get_410_and_reserved_ones_can_still_be_paid()
-> anyhow::Result<()> {
    // One replica still open takes an order; a replica of the same sale
    // whose configuration says the sale closed a minute ago serves the rest.
    let funnel = Funnel::start(Options::default()).await?;
    let (status, body, _) = order(&funnel.gateway.url, "alice", "A", "in-time", None).await?;
    assert_eq!(status, 201, "{body}");
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();
    assert_eq!(funnel.available("A").await?, 99);

    let now = jiff::Timestamp::now();
    let mut config = funnel.config.clone();
    config.opens_at = Some(now - jiff::SignedDuration::from_hours(1));
    config.closes_at = Some(now - jiff::SignedDuration::from_secs(60));
    config.check()?;
    let closed = common::Running::start(
        config,
        &funnel.inventory.url,
        &funnel.brokers,
        &funnel.topic,
        gateway::server::SwitchSource::None,
    )
    .await?;

    let (status, body, _) = order(&closed.url, "bob", "A", "late", None).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (410, Some("sale_ended")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("closed at"),
        "{body}"
    );
    // A retry of the order placed in time is refused too: no new intake.
    let (status, _, _) = order(&closed.url, "alice", "A", "in-time", None).await?;
    assert_eq!(status, 410);
    assert_eq!(funnel.available("A").await?, 99, "no more stock held");

    let (status, paid) = provider_pays(&closed.url, &order_id, 1999, "CNY", now_s()).await?;
    assert_eq!((status, &paid["status"]), (200, &json!("paid")), "{paid}");
    // Sorted: `paid` is published by the gateway and may overtake `created`,
    // which waits in the inventory's outbox (docs/design/inventory.md).
    let mut kinds: Vec<String> = funnel
        .events()
        .await?
        .iter()
        .map(|e| format!("{}:{:?}", e.user_id, e.kind))
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["alice:Created", "alice:Paid"]);
    assert_eq!(
        closed.metric(r#"gateway_requests_total{route="/api/v1/orders",code="410"}"#),
        Some(2.0)
    );
    drop(closed);
    funnel.cleanup().await
}

/// Two concurrent requests with one idempotency key but different bodies:
/// one order is made, the other request is refused, and the event says
/// exactly what was reserved.
#[tokio::test]
async fn one_key_with_two_bodies_makes_one_order_of_what_was_reserved() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let gw = funnel.gateway.url.clone();
    let send = |sku: &'static str, quantity: u64| {
        let gw = gw.clone();
        async move {
            let response = http()
                .post(format!("{gw}/api/v1/orders"))
                .bearer_auth(token("eve"))
                .json(&json!({"sku": sku, "quantity": quantity, "idempotencyKey": "one-key"}))
                .send()
                .await?;
            let status = response.status().as_u16();
            anyhow::Ok((
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            ))
        }
    };
    let (a, b) = tokio::join!(send("A", 1), send("B", 5));
    let (a, b) = (a?, b?);
    let (won, lost) = if a.0 == 201 { (a, b) } else { (b, a) };
    assert_eq!(won.0, 201, "{won:?} {lost:?}");
    assert_eq!(
        (lost.0, lost.1["error"].as_str()),
        (409, Some("idempotency_key_reused")),
        "{lost:?}"
    );
    let stored = funnel.events().await?;
    assert_eq!(stored.len(), 1, "{stored:?}");
    let event = &stored[0];
    assert_eq!(
        (
            json!(event.sku),
            json!(event.quantity),
            json!(event.amount_minor),
            json!(event.order_id)
        ),
        (
            won.1["sku"].clone(),
            won.1["quantity"].clone(),
            won.1["amountMinor"].clone(),
            won.1["orderId"].clone()
        ),
        "the event and the answer agree"
    );
    let held = funnel.available("A").await? + funnel.available("B").await?;
    assert_eq!(
        200 - held,
        u64::try_from(event.quantity)?,
        "only what the event says is held"
    );
    funnel.cleanup().await
}

/// The inventory request id the gateway derives for (sale, user, key).
fn request_id(sale: &str, user: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for part in [sale, user, key] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Leaves, as a crashed inventory would, a reservation of 1 × A for
/// (user, key) in `state`.
async fn leave_reservation(
    funnel: &Funnel,
    user: &str,
    key: &str,
    state: &str,
) -> anyhow::Result<()> {
    let redis = redis::Client::open(flashsale_e2e::stack::redis_url()?)?;
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let rid = request_id(&funnel.sale, user, key);
    let id = format!("left{}", &rid[..16]);
    let expires = jiff::Timestamp::now().as_millisecond() + 60_000;
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(format!("fs:{{{}}}:req:{rid}", funnel.sale))
        .arg(format!("{id} A 1"))
        .ignore()
        .cmd("HSET")
        .arg(format!("fs:{{{}}}:resv:{id}", funnel.sale))
        .arg(&[
            ("sku", "A"),
            ("user", user),
            ("qty", "1"),
            ("amount", "1999"),
            ("shard", "-1"),
            ("state", state),
            ("request", rid.as_str()),
        ])
        .arg("expires_at")
        .arg(expires)
        .ignore()
        .query_async(&mut conn)
        .await?;
    Ok(())
}

#[tokio::test]
async fn only_a_settled_reservation_is_an_order() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let gw = &funnel.gateway.url;
    leave_reservation(&funnel, "fay", "unsettled", "pending").await?;
    let (status, body, headers) = order(gw, "fay", "A", "unsettled", None).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    assert!(headers.contains_key("retry-after"));
    leave_reservation(&funnel, "fay", "returning", "releasing").await?;
    let (status, body, _) = order(gw, "fay", "A", "returning", None).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("order_abandoned")),
        "{body}"
    );
    assert!(
        funnel.events().await?.is_empty(),
        "no order was published for stock not held"
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn buyers_whose_subject_is_an_email_or_uuid_can_order_and_pay() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let gw = &funnel.gateway.url;
    for user in [
        "ann.buyer+sale@example.com",
        "0b5e7c1a-58f4-4f7e-9a43-3c1d2e4f5a6b",
    ] {
        let (status, body, _) = order(gw, user, "A", "key-1", None).await?;
        assert_eq!(status, 201, "{user}: {body}");
        let order_id = body["orderId"].as_str().unwrap_or_default();
        let started = http()
            .post(format!("{gw}/api/v1/orders/{order_id}/pay"))
            .bearer_auth(token(user))
            .send()
            .await?;
        assert_eq!(started.status().as_u16(), 202, "{user}");
        let (status, paid) = provider_pays(gw, order_id, 1999, "CNY", now_s()).await?;
        assert_eq!((status, &paid["status"]), (200, &json!("paid")), "{paid}");
    }
    let users: Vec<String> = funnel
        .events()
        .await?
        .into_iter()
        .map(|e| e.user_id)
        .collect();
    assert!(
        users.iter().any(|u| u == "ann.buyer+sale@example.com"),
        "{users:?}"
    );
    // A subject outside the rule is refused at the token, before any stock moves.
    let (status, body, _) = order(gw, "josé@example.com", "A", "key-1", None).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("invalid_token")),
        "{body}"
    );
    assert_eq!(funnel.available("A").await?, 98);
    funnel.cleanup().await
}

/// Adds `delta` units of `sku` through the inventory's admin API.
async fn restock(funnel: &Funnel, sku: &str, delta: i64) -> anyhow::Result<()> {
    let response = http()
        .post(format!(
            "{}/v1/sales/{}/items/{sku}/adjustments",
            funnel.inventory.url, funnel.sale
        ))
        .bearer_auth(flashsale_e2e::funnel::INVENTORY_ADMIN_TOKEN)
        .json(&json!({"delta": delta, "reason": "restock"}))
        .send()
        .await?;
    anyhow::ensure!(response.status().is_success(), "{}", response.text().await?);
    Ok(())
}

/// A SKU found sold out is answered so from the gateway's memory (no
/// inventory, no Redis) for `soldOutRecheckMs`; a restock is learned within
/// that plus the inventory's own 200 ms, and no order is answered sold out
/// after that bound.
#[tokio::test]
async fn a_sold_out_sku_is_answered_from_memory_and_a_restock_learned_within_its_bound()
-> anyhow::Result<()> {
    const RECHECK: Duration = Duration::from_millis(1_000);
    let bound = RECHECK + Duration::from_millis(200);
    let funnel = Funnel::start(Options {
        stock: 1,
        per_user_limit: 1,
        config: json!({"soldOutRecheckMs": RECHECK.as_millis() as u64, "requestTimeoutMs": 500}),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let code = |answer: &(u16, Value, _)| (answer.0, answer.1["error"].as_str().map(str::to_owned));
    let sold_out = || (409, Some("sold_out".to_owned()));
    assert_eq!(order(gw, "alice", "A", "k", None).await?.0, 201);
    assert_eq!(code(&order(gw, "bob", "A", "k", None).await?), sold_out());
    let from_memory = || funnel.gateway.metric("gateway_sold_out_from_memory_total");
    assert_eq!(from_memory(), Some(0.0), "the inventory said so");
    assert_eq!(code(&order(gw, "carol", "A", "k", None).await?), sold_out());
    assert_eq!(from_memory(), Some(1.0), "then memory did");

    // Restocked: every order answered sold out after the bound is a failure.
    restock(&funnel, "A", 1).await?;
    let restocked = std::time::Instant::now();
    let mut buyer = 0;
    let took = poll_until(
        "a restocked unit to be sold",
        bound + Duration::from_secs(2),
        Duration::from_millis(20),
        || {
            buyer += 1;
            let user = format!("late{buyer}");
            async move {
                let answer = order(gw, &user, "A", "k", None)
                    .await
                    .map_err(|e| e.to_string())?;
                let at = restocked.elapsed();
                match code(&answer) {
                    (201, _) => Ok(at),
                    other if other == sold_out() && at < bound => {
                        Err(format!("sold out at {at:?}"))
                    }
                    other => panic!("answered {other:?} {at:?} after the restock: {}", answer.1),
                }
            }
        },
    )
    .await?;
    assert!(
        took < bound + Duration::from_millis(300),
        "sold only {took:?} after the restock"
    );

    // Sold out again; with the inventory gone, only memory can answer,
    // until the recheck: then the gateway asks and finds no inventory.
    assert_eq!(code(&order(gw, "dave", "A", "k", None).await?), sold_out());
    let flagged = std::time::Instant::now();
    funnel.inventory.stop();
    let (asked_at, buyer) = asked_again(gw, RECHECK).await?;
    let asked = asked_at.duration_since(flagged);
    assert!(
        buyer > 1,
        "the first order after the flag was answered from memory"
    );
    assert!(
        asked >= RECHECK.saturating_sub(Duration::from_millis(50))
            && asked < RECHECK + Duration::from_millis(500),
        "asked again {asked:?} after the flag, recheck {RECHECK:?}"
    );
    funnel.cleanup().await
}

/// Orders `A` as new buyers until an answer is not `sold_out` (which must
/// be the 503 of a missing inventory): when that order was sent, and how
/// many orders it took.
async fn asked_again(gw: &str, recheck: Duration) -> anyhow::Result<(std::time::Instant, usize)> {
    let mut buyer = 0;
    let at = poll_until(
        "the gateway to ask the inventory again",
        recheck + Duration::from_secs(2),
        Duration::from_millis(20),
        || {
            buyer += 1;
            let user = format!("gone{buyer}");
            async move {
                let sent = std::time::Instant::now();
                let (status, body, _) = order(gw, &user, "A", "k", None)
                    .await
                    .map_err(|e| e.to_string())?;
                match (status, body["error"].as_str()) {
                    (503, _) => Ok(sent),
                    (409, Some("sold_out")) => Err("answered from memory".to_owned()),
                    other => panic!("answered {other:?} with the inventory gone: {body}"),
                }
            }
        },
    )
    .await?;
    Ok((at, buyer))
}
