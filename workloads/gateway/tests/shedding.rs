//! The shedding layers through the HTTP API: the waiting room across two
//! replicas, degradation switches reaching both replicas from a real
//! ConfigMap, and the degraded non-core routes.

mod common;

use std::{collections::BTreeMap, time::Duration};

use common::{Funnel, Options, Running, http, order, token, wait_for_pass};
use flashsale_e2e::{kube::TestNamespace, wait::poll_until};
use gateway::server::SwitchSource;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn room(admit_per_second: u32) -> Value {
    json!({"waitingRoom": {"enabled": true, "admitPerSecond": admit_per_second, "passTtlSeconds": 60}})
}

#[tokio::test]
async fn the_waiting_room_admits_in_order_with_one_time_passes() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: room(10),
        ..Options::default()
    })
    .await?;
    let second = funnel.replica(SwitchSource::None).await?;
    let replicas = [funnel.gateway.url.clone(), second.url.clone()];

    // Without a pass an order is queued: 202, the ticket in JSON and as a cookie.
    let mut tickets = Vec::new();
    for (i, user) in ["u1", "u2", "u3", "u4"].iter().enumerate() {
        let (status, body, headers) = order(&replicas[i % 2], user, "A", "k", None).await?;
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["status"], "queued");
        let cookie = headers
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(
            cookie.starts_with("fs_queue_ticket=") && cookie.contains("HttpOnly"),
            "{cookie}"
        );
        tickets.push((
            user.to_string(),
            body["ticket"].as_str().unwrap_or_default().to_owned(),
            body["position"].as_u64().unwrap_or(0),
        ));
    }
    let positions: Vec<u64> = tickets.iter().map(|t| t.2).collect();
    assert!(
        positions.windows(2).all(|w| w[1] == w[0] + 1),
        "consecutive positions across replicas: {positions:?}"
    );

    // Each user is admitted (through either replica) and orders once with the pass.
    let mut passes = Vec::new();
    for (i, (user, ticket, _)) in tickets.iter().enumerate() {
        let pass = wait_for_pass(&replicas[(i + 1) % 2], ticket, Duration::from_secs(10)).await?;
        let (status, body, _) = order(&replicas[i % 2], user, "A", "k", Some(&pass)).await?;
        assert_eq!(status, 201, "{user}: {body}");
        passes.push(pass);
    }
    // Replay, swap and forgery are refused with their reason.
    let (status, body, _) = order(&replicas[0], "u1", "A", "k2", Some(&passes[0])).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("replayed")),
        "{body}"
    );
    let (status, body, _) = order(&replicas[1], "u2", "A", "k2", Some(&passes[2])).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("other_user")),
        "{body}"
    );
    // Change the first character of the MAC (always a full base64 sextet, so
    // the token still decodes and only the signature is wrong).
    let mut forged = passes[3].clone().into_bytes();
    if let Some(at) = forged.iter().position(|b| *b == b'.').map(|dot| dot + 1)
        && let Some(c) = forged.get_mut(at)
    {
        *c = if *c == b'A' { b'B' } else { b'A' };
    }
    let forged = String::from_utf8(forged)?;
    let (status, body, _) = order(&replicas[0], "u4", "A", "k3", Some(&forged)).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("forged")),
        "{body}"
    );
    // A ticket shown with another user's token is refused too.
    let swapped = http()
        .get(format!("{}/api/v1/queue/status", replicas[0]))
        .header("x-queue-ticket", &tickets[0].1)
        .bearer_auth(token("u2"))
        .send()
        .await?;
    assert_eq!(swapped.status().as_u16(), 403);
    assert_eq!(swapped.json::<Value>().await?["error"], "other_user");
    let admitted = funnel
        .gateway
        .metric("gateway_admitted_total")
        .unwrap_or(0.0)
        + second.metric("gateway_admitted_total").unwrap_or(0.0);
    assert_eq!(admitted, 4.0);
    drop(second);
    funnel.cleanup().await
}

#[tokio::test]
async fn a_failed_order_gives_the_pass_back() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: room(50),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let (_, body, _) = order(gw, "u1", "A", "k", None).await?;
    let pass = wait_for_pass(
        gw,
        body["ticket"].as_str().unwrap_or_default(),
        Duration::from_secs(5),
    )
    .await?;
    funnel.inventory.stop();
    let (status, _, _) = order(gw, "u1", "A", "k", Some(&pass)).await?;
    assert_eq!(status, 503);
    // The pass was not burnt by the outage: the next attempt is not a replay.
    let (status, body, _) = order(gw, "u1", "A", "k", Some(&pass)).await?;
    assert_eq!(
        status, 503,
        "still down, but not refused as replayed: {body}"
    );
    funnel.cleanup().await
}

/// Only an order that went through uses a pass up: a sold-out SKU is not
/// the buyer's fault, so the same pass buys something else.
#[tokio::test]
async fn a_pass_is_used_up_only_by_an_order_that_went_through() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        stock: 1,
        config: room(50),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let pass_for = |user: &'static str| async move {
        let (_, body, _) = order(gw, user, "A", "join", None).await?;
        wait_for_pass(
            gw,
            body["ticket"].as_str().unwrap_or_default(),
            Duration::from_secs(5),
        )
        .await
    };
    let first = pass_for("u1").await?;
    let (status, body, _) = order(gw, "u1", "A", "k1", Some(&first)).await?;
    assert_eq!(status, 201, "{body}");
    let second = pass_for("u2").await?;
    let (status, body, _) = order(gw, "u2", "A", "k2", Some(&second)).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("sold_out")),
        "{body}"
    );
    let (status, body, _) = order(gw, "u2", "B", "k3", Some(&second)).await?;
    assert_eq!(status, 201, "the sold-out attempt left the pass: {body}");
    // Both passes are spent now.
    for (user, pass) in [("u1", &first), ("u2", &second)] {
        let (status, body, _) = order(gw, user, "B", "again", Some(pass)).await?;
        assert!(status >= 400 && status != 503, "{user}: {status} {body}");
    }
    funnel.cleanup().await
}

fn degradation_data(tier: u32, generation: u64, switches: Value) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("tier".to_owned(), tier.to_string()),
        ("generation".to_owned(), generation.to_string()),
        ("switches".to_owned(), switches.to_string()),
        ("reason".to_owned(), "test".to_owned()),
        ("changedAt".to_owned(), jiff::Timestamp::now().to_string()),
    ])
}

async fn games(gateway: &str) -> Result<(u16, Value, Option<String>), String> {
    let response = http()
        .get(format!("{gateway}/api/v1/games"))
        .bearer_auth(token("player"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let degraded = response
        .headers()
        .get("x-flashsale-degraded")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.json().await.map_err(|e| e.to_string())?;
    Ok((status, body, degraded))
}

/// Waits until `replica` reports degradation generation `generation`.
async fn wait_for_generation(
    replica: &Running,
    generation: f64,
    what: &str,
    within: Duration,
    every: Duration,
) -> anyhow::Result<()> {
    poll_until(what, within, every, || async {
        match replica.metric("gateway_degradation_generation") {
            Some(seen) if seen == generation => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

/// Creates the degradation ConfigMap `name` (tier 0, generation 1, no
/// switch) as the degradation controller labels it; its API for changes.
async fn create_switch_map(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Api<ConfigMap>> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                [(
                    flashsale_degradation::MANAGED_BY_KEY.to_owned(),
                    flashsale_degradation::MANAGED_BY.to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some(degradation_data(0, 1, json!({}))),
        ..ConfigMap::default()
    };
    maps.create(&PostParams::default(), &map).await?;
    Ok(maps)
}

#[tokio::test]
async fn a_configmap_change_reaches_both_replicas() -> anyhow::Result<()> {
    let client = flashsale_e2e::kube::client().await?;
    let namespace = TestNamespace::create(&client, "gw-switch").await?;
    let name = "sale-degradation".to_owned();
    let maps = create_switch_map(&client, &namespace.name, &name).await?;
    let source = SwitchSource::ConfigMap {
        namespace: namespace.name.clone(),
        name: name.clone(),
    };
    let funnel = Funnel::start(Options {
        switches: source.clone(),
        ..Options::default()
    })
    .await?;
    let second = funnel.replica(source).await?;
    for replica in [&funnel.gateway, &second] {
        wait_for_generation(
            replica,
            1.0,
            "the initial generation",
            Duration::from_secs(10),
            Duration::from_millis(20),
        )
        .await?;
        let (status, body, _) = games(&replica.url).await.map_err(anyhow::Error::msg)?;
        assert_eq!((status, body["open"].as_bool()), (200, Some(true)));
    }

    let patch = json!({"data": degradation_data(2, 2, json!({"miniGames": "closed", "recommendations": "static"}))});
    maps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    for replica in [&funnel.gateway, &second] {
        let (status, body, degraded) = poll_until(
            "the closed notice",
            Duration::from_secs(10),
            Duration::from_millis(5),
            || async {
                let answer = games(&replica.url).await?;
                if answer.1["open"] == false {
                    Ok(answer)
                } else {
                    Err(answer.1.to_string())
                }
            },
        )
        .await?;
        assert_eq!(status, 200, "a closed notice is a page, not an error");
        assert_eq!(degraded.as_deref(), Some("miniGames=closed"));
        assert!(body["notice"].is_string());
        assert_eq!(replica.metric("gateway_degradation_tier"), Some(2.0));
        assert_eq!(replica.metric("gateway_degradation_generation"), Some(2.0));
    }
    // Recommendations went static; checkout (tier 0) has no switch and still works.
    let recommendations: Value = http()
        .get(format!("{}/api/v1/recommendations", second.url))
        .bearer_auth(token("player"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(recommendations["mode"], "static");
    assert_eq!(order(&second.url, "buyer", "A", "k", None).await?.0, 201);
    drop(second);
    funnel.cleanup().await
}

/// A shopper's requests to one gateway.
struct Shopper {
    gateway: String,
}

impl Shopper {
    /// GETs `path` with the shopper's token.
    async fn get(&self, path: &str) -> reqwest::Result<reqwest::Response> {
        http()
            .get(format!("{}{path}", self.gateway))
            .bearer_auth(token("shopper"))
            .send()
            .await
    }

    /// POSTs `body` to `path` with the shopper's token.
    async fn post(&self, path: &str, body: Value) -> reqwest::Result<reqwest::Response> {
        http()
            .post(format!("{}{path}", self.gateway))
            .bearer_auth(token("shopper"))
            .json(&body)
            .send()
            .await
    }
}

#[tokio::test]
async fn every_non_core_route_degrades_for_real() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(flashsale_e2e::stack::unique_name("gw-switches"));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("degradation.json");
    std::fs::write(
        &file,
        serde_json::to_string(&degradation_data(0, 1, json!({})))?,
    )?;
    let funnel = Funnel::start(Options {
        switches: SwitchSource::File(file.clone()),
        ..Options::default()
    })
    .await?;
    let shopper = Shopper {
        gateway: funnel.gateway.url.clone(),
    };
    let review = json!({"sku": "A", "rating": 5, "text": "great"});
    check_normal_modes(&shopper, &review).await?;

    let all = json!({"recommendations": "static", "orderHistory": "last7Days", "voucherPush": "deferred",
                     "reviews": "queued", "shopChat": "throttled", "miniGames": "closed"});
    std::fs::write(&file, serde_json::to_string(&degradation_data(2, 2, all))?)?;
    wait_for_generation(
        &funnel.gateway,
        2.0,
        "the file's switches",
        Duration::from_secs(5),
        Duration::from_millis(5),
    )
    .await?;
    check_degraded_modes(&shopper, review).await?;
    assert_eq!(
        order(&shopper.gateway, "shopper", "A", "k", None).await?.0,
        201
    );
    let _ = std::fs::remove_dir_all(&dir);
    funnel.cleanup().await
}

/// Every non-core route in its normal mode.
async fn check_normal_modes(shopper: &Shopper, review: &Value) -> anyhow::Result<()> {
    assert_eq!(
        shopper
            .get("/api/v1/recommendations")
            .await?
            .json::<Value>()
            .await?["mode"],
        "personal"
    );
    assert_eq!(
        shopper
            .get("/api/v1/orders/history?days=30")
            .await?
            .json::<Value>()
            .await?["days"],
        30
    );
    assert_eq!(
        shopper
            .post("/api/v1/vouchers/push", json!({}))
            .await?
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        shopper
            .post("/api/v1/reviews", review.clone())
            .await?
            .status()
            .as_u16(),
        201
    );
    for _ in 0..3 {
        assert_eq!(
            shopper
                .post("/api/v1/chat/messages", json!({}))
                .await?
                .status()
                .as_u16(),
            200
        );
    }
    Ok(())
}

/// Every non-core route in its degraded mode; the stock page coarse.
async fn check_degraded_modes(shopper: &Shopper, review: Value) -> anyhow::Result<()> {
    let recommendations = shopper.get("/api/v1/recommendations").await?;
    assert_eq!(
        recommendations.headers()["x-flashsale-degraded"],
        "recommendations=static"
    );
    assert_eq!(recommendations.json::<Value>().await?["mode"], "static");
    let history: Value = shopper
        .get("/api/v1/orders/history?days=30")
        .await?
        .json()
        .await?;
    assert_eq!(
        (history["mode"].as_str(), history["days"].as_u64()),
        (Some("last7Days"), Some(7))
    );
    assert_eq!(
        shopper
            .post("/api/v1/vouchers/push", json!({}))
            .await?
            .status()
            .as_u16(),
        202
    );
    let queued = shopper.post("/api/v1/reviews", review).await?;
    assert_eq!(queued.status().as_u16(), 202);
    assert_eq!(queued.json::<Value>().await?["status"], "queued");
    assert_eq!(
        shopper
            .post("/api/v1/chat/messages", json!({}))
            .await?
            .status()
            .as_u16(),
        200
    );
    let throttled = shopper.post("/api/v1/chat/messages", json!({})).await?;
    assert_eq!(throttled.status().as_u16(), 429, "one message per 5 s");
    assert_eq!(throttled.headers()["retry-after"], "5");
    let games: Value = shopper.get("/api/v1/games").await?.json().await?;
    assert_eq!(games["open"], false);
    // The stock page turns coarse under load; ordering is untouched.
    let item: Value = shopper.get("/api/v1/items/A").await?.json().await?;
    assert_eq!(
        (item["status"].as_str(), item.get("available")),
        (Some("available"), None)
    );
    Ok(())
}
