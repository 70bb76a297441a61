//! The reservation API over real HTTP on loopback, backed by the real Redis.

use std::time::Duration;

use flashsale_e2e::stack;
use inventory::{
    api::{self, AppState, MAX_BODY_BYTES},
    auth::Tokens,
    metrics::Metrics,
    store::Store,
};
use reqwest::{Client, StatusCode, header};
use serde_json::{Value, json};

const API_TOKEN: &str = "api-token-of-the-tests";
const ADMIN_TOKEN: &str = "admin-token-of-the-tests";

/// A client that sends `token` on every request.
fn client_with(token: &str) -> anyhow::Result<Client> {
    let mut headers = header::HeaderMap::new();
    headers.insert(header::AUTHORIZATION, format!("Bearer {token}").parse()?);
    Ok(Client::builder().default_headers(headers).build()?)
}

struct Api {
    base: String,
    http: Client,
    sale: String,
}

impl Api {
    async fn start() -> anyhow::Result<Self> {
        Self::start_with(Duration::from_secs(60)).await
    }

    async fn start_with(sold_out_staleness: Duration) -> anyhow::Result<Self> {
        let store = Store::connect(&stack::redis_url()?).await?;
        let state = AppState::new(store, Metrics::default(), sold_out_staleness)
            .with_tokens(Tokens::new(Some(API_TOKEN), Some(ADMIN_TOKEN)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, api::router(state)).await });
        let api = Self {
            base,
            http: client_with(ADMIN_TOKEN)?,
            sale: stack::unique_name("http"),
        };
        let (status, body) = api
            .post(
                "/v1/sales",
                json!({"sale": api.sale, "reservationTtlMs": 60000,
                       "items": [{"sku": "PHONE", "stock": 3, "perUserLimit": 2, "shards": 1}]}),
            )
            .await?;
        anyhow::ensure!(status == StatusCode::OK, "load: {status} {body}");
        Ok(api)
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<(StatusCode, Value)> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await?;
        Ok((
            response.status(),
            response.json().await.unwrap_or(Value::Null),
        ))
    }

    async fn raw(&self, path: &str, body: Vec<u8>) -> anyhow::Result<(StatusCode, Value)> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        Ok((
            response.status(),
            response.json().await.unwrap_or(Value::Null),
        ))
    }

    async fn reserve(
        &self,
        user: &str,
        quantity: u64,
        request_id: &str,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let body =
            json!({"sku": "PHONE", "user": user, "quantity": quantity, "requestId": request_id});
        self.post(&self.reservations(), body).await
    }

    fn reservations(&self) -> String {
        format!("/v1/sales/{}/reservations", self.sale)
    }

    /// The stock of `PHONE` as the API reports it.
    async fn stock(&self) -> anyhow::Result<Value> {
        Ok(self
            .http
            .get(format!(
                "{}/v1/sales/{}/items/PHONE/stock",
                self.base, self.sale
            ))
            .send()
            .await?
            .json()
            .await?)
    }
}

/// A refused request: (case, answer, expected status, expected error code,
/// text the message must contain).
type Case = (
    &'static str,
    (StatusCode, Value),
    StatusCode,
    &'static str,
    &'static str,
);

#[tokio::test]
async fn reserve_confirm_cancel_and_stock_over_http() -> anyhow::Result<()> {
    let api = Api::start().await?;
    let (status, body) = api.reserve("u1", 2, "r1").await?;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap_or_default().to_owned();
    // A fresh reservation answers with its whole record: callers build the
    // order from it, not from their request.
    assert_eq!(
        (
            &body["sku"],
            &body["user"],
            &body["quantity"],
            &body["state"],
            &body["request_id"]
        ),
        (
            &json!("PHONE"),
            &json!("u1"),
            &json!(2),
            &json!("reserved"),
            &json!("r1")
        ),
        "{body}"
    );

    let (status, retry) = api.reserve("u1", 2, "r1").await?;
    assert_eq!(
        (status, retry["id"].as_str()),
        (StatusCode::OK, Some(id.as_str())),
        "{retry}"
    );

    let (status, body) = api.reserve("u1", 1, "r2").await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("user_limit")),
        "{body}"
    );

    let (status, body) = api
        .post(&format!("{}/{id}/confirm", api.reservations()), json!({}))
        .await?;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "{body}"
    );
    let (status, body) = api
        .post(&format!("{}/{id}/cancel", api.reservations()), json!({}))
        .await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("confirmed")),
        "{body}"
    );

    let (status, body) = api.reserve("u2", 2, "r3").await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out")),
        "{body}"
    );

    let stock = api.stock().await?;
    assert_eq!(
        stock,
        json!({"stock": 3, "available": 1, "reserved": 0, "sold": 2})
    );
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_a_4xx_json_error_naming_the_problem() -> anyhow::Result<()> {
    let api = Api::start().await?;
    let mut cases = bad_reservation_fields(&api).await?;
    cases.extend(bad_bodies_and_places(&api).await?);
    let mut failures = Vec::new();
    for (case, (status, body), want_status, want_code, mentions) in cases {
        let message = body["message"].as_str().unwrap_or_default();
        if status != want_status || body["error"] != want_code || !message.contains(mentions) {
            failures.push(format!("{case}: got {status} {body}, want {want_status} {want_code} mentioning {mentions:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Nothing above took stock.
    let stock = api.stock().await?;
    assert_eq!(stock["available"], 3);
    Ok(())
}

/// A reservation body the API takes.
fn valid_reservation() -> Value {
    json!({"sku": "PHONE", "user": "u1", "quantity": 1, "requestId": "r1"})
}

/// Reservations with one field of a valid body wrong or missing, sent in
/// turn, with what each must be answered.
async fn bad_reservation_fields(api: &Api) -> anyhow::Result<Vec<Case>> {
    let path = api.reservations();
    let ok = valid_reservation();
    let with = |field: &str, value: Value| {
        let mut body = ok.clone();
        body[field] = value;
        body
    };
    Ok(vec![
        (
            "zero quantity",
            api.post(&path, with("quantity", json!(0))).await?,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "quantity",
        ),
        (
            "negative quantity",
            api.post(&path, with("quantity", json!(-3))).await?,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "quantity",
        ),
        (
            "huge quantity",
            api.post(&path, with("quantity", json!(1_000_000))).await?,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "quantity",
        ),
        (
            "quantity as text",
            api.post(&path, with("quantity", json!("two"))).await?,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_json",
            "quantity",
        ),
        (
            "unknown SKU",
            api.post(&path, with("sku", json!("TABLET"))).await?,
            StatusCode::NOT_FOUND,
            "unknown_sku",
            "TABLET",
        ),
        (
            "SKU with spaces",
            api.post(&path, with("sku", json!("big phone"))).await?,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "sku",
        ),
        (
            "empty user",
            api.post(&path, with("user", json!(""))).await?,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "user",
        ),
        (
            "missing request id",
            api.post(&path, json!({"sku": "PHONE", "user": "u1", "quantity": 1}))
                .await?,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_json",
            "requestId",
        ),
        (
            "unknown field",
            api.post(&path, with("price", json!(1))).await?,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_json",
            "price",
        ),
    ])
}

/// Bodies that are not JSON or too large, a valid body sent where nothing
/// answers it, and a sale without items, sent in turn, with what each must
/// be answered.
async fn bad_bodies_and_places(api: &Api) -> anyhow::Result<Vec<Case>> {
    let path = api.reservations();
    let ok = valid_reservation();
    Ok(vec![
        (
            "invalid JSON",
            api.raw(&path, b"{\"sku\": ".to_vec()).await?,
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "",
        ),
        (
            "huge body",
            api.raw(&path, vec![b' '; MAX_BODY_BYTES + 1]).await?,
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "bytes",
        ),
        (
            "unknown sale",
            api.post("/v1/sales/nope/reservations", ok.clone()).await?,
            StatusCode::NOT_FOUND,
            "unknown_sale",
            "nope",
        ),
        (
            "unknown route",
            api.post("/v2/whatever", ok.clone()).await?,
            StatusCode::NOT_FOUND,
            "not_found",
            "route",
        ),
        (
            "load without items",
            api.post(
                "/v1/sales",
                json!({"sale": "x", "reservationTtlMs": 1000, "items": []}),
            )
            .await?,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "items",
        ),
    ])
}

#[tokio::test]
async fn adjustments_are_audited_take_only_available_units_and_clear_sold_out() -> anyhow::Result<()>
{
    let api = Api::start().await?;
    let adjustments = format!("/v1/sales/{}/items/PHONE/adjustments", api.sale);
    for (user, rid) in [("a", "ra"), ("b", "rb")] {
        let (status, _) = api.reserve(user, 1, rid).await?;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (status, body) = api.reserve("c", 2, "rc").await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out")),
        "{body}"
    );

    // Removing more than is available removes only what is available.
    let (status, report) = api
        .post(
            &adjustments,
            json!({"delta": -5, "reason": "damaged in warehouse"}),
        )
        .await?;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (report["requested"].as_i64(), report["applied"].as_i64()),
        (Some(-5), Some(-1)),
        "{report}"
    );
    assert_eq!(
        report["after"],
        json!({"stock": 2, "available": 0, "reserved": 2, "sold": 0})
    );

    // A restock clears this replica's sold-out memory at once.
    let (status, report) = api
        .post(
            &adjustments,
            json!({"delta": 10, "reason": "second pallet"}),
        )
        .await?;
    assert_eq!(
        (status, report["applied"].as_i64()),
        (StatusCode::OK, Some(10)),
        "{report}"
    );
    let (status, body) = api.reserve("c", 2, "rc2").await?;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let (status, body) = api
        .post(&adjustments, json!({"delta": 3, "reason": " "}))
        .await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request")),
        "{body}"
    );

    let redis = redis::Client::open(stack::redis_url()?)?;
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let audit: redis::Value = redis::cmd("XRANGE")
        .arg(format!("fs:{{{}}}:audit", api.sale))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await?;
    let text = format!("{audit:?}");
    assert!(
        text.contains("damaged in warehouse") && text.contains("second pallet"),
        "{text}"
    );
    Ok(())
}

/// A replica that saw a SKU sold out answers from memory, even after another
/// replica restocked, until the staleness bound passes; then it asks Redis.
#[tokio::test]
async fn sold_out_is_remembered_for_the_staleness_bound_only() -> anyhow::Result<()> {
    let api = Api::start_with(Duration::from_millis(500)).await?;
    let (status, _) = api.reserve("a", 2, "a1").await?;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = api.reserve("b", 2, "b1").await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out"))
    );
    let remembered_at = std::time::Instant::now();

    // Another replica restocks: this one does not hear of it.
    let other = Store::connect(&stack::redis_url()?).await?;
    other
        .load(&inventory::store::SaleDefinition {
            sale: api.sale.clone(),
            opens_at_ms: None,
            reservation_ttl_ms: 60_000,
            items: vec![inventory::store::ItemDefinition {
                sku: "PHONE".into(),
                stock: 3,
                per_user_limit: 2,
                shards: 1,
            }],
        })
        .await?;
    other
        .adjust(&api.sale, "PHONE", 5, "restock from another replica")
        .await?;

    let (status, _) = api.reserve("b", 2, "b2").await?;
    if remembered_at.elapsed() < Duration::from_millis(400) {
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "answered from the local flag without asking Redis"
        );
    }
    let created = flashsale_e2e::wait::poll_until(
        "the flag to lapse",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async {
            let (status, body) = api.reserve("b", 2, "b3").await.map_err(|e| e.to_string())?;
            if status == StatusCode::CREATED {
                Ok(body)
            } else {
                Err(format!("{status} {body}"))
            }
        },
    )
    .await?;
    assert!(
        remembered_at.elapsed() >= Duration::from_millis(500),
        "flag lapsed early"
    );
    assert!(created["id"].is_string());
    Ok(())
}

#[tokio::test]
async fn a_request_id_reused_for_another_order_is_a_409() -> anyhow::Result<()> {
    let api = Api::start().await?;
    let (status, first) = api.reserve("u1", 1, "same-key").await?;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, body) = api.reserve("u1", 2, "same-key").await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("idempotency_mismatch")),
        "{body}"
    );
    // The first order stands, alone.
    let (status, again) = api.reserve("u1", 1, "same-key").await?;
    assert_eq!((status, &again["id"]), (StatusCode::OK, &first["id"]));
    Ok(())
}

/// A batch's members are each answered as if posted alone, in order: made,
/// repeated, refused for bad input, over the user's limit, granted; then
/// sold out. The stock moves by exactly the units granted.
#[tokio::test]
async fn a_batch_answers_each_member_as_if_it_came_alone() -> anyhow::Result<()> {
    let api = Api::start().await?;
    let (status, first) = api.reserve("u1", 1, "before").await?;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let member = |user: &str, quantity: i64, id: &str| json!({"sku": "PHONE", "user": user, "quantity": quantity, "requestId": id});
    let batches = format!("/v1/sales/{}/reservation-batches", api.sale);
    let (status, body) = api
        .post(
            &batches,
            json!({"reservations": [
                member("u1", 1, "before"),
                member("u2", 0, "zero"),
                member("u1", 2, "over-limit"),
                member("u2", 2, "granted"),
            ]}),
        )
        .await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answers: Vec<(u64, Option<&str>)> = body["results"]
        .as_array()
        .map(|results| {
            results
                .iter()
                .map(|r| {
                    let status = r["status"].as_u64().unwrap_or_default();
                    let code = r["error"]["error"].as_str();
                    (status, code)
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        answers,
        [
            (200, None),
            (400, Some("invalid_request")),
            (409, Some("user_limit")),
            (201, None),
        ],
        "{body}"
    );
    assert_eq!(body["results"][0]["reservation"]["id"], first["id"]);
    assert_eq!(body["results"][3]["reservation"]["quantity"], 2);
    let stock = api.stock().await?;
    assert_eq!(
        (stock["available"].as_u64(), stock["reserved"].as_u64()),
        (Some(0), Some(3))
    );
    let (status, body) = api
        .post(&batches, json!({"reservations": [member("u3", 1, "late")]}))
        .await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (
            &body["results"][0]["status"],
            &body["results"][0]["error"]["error"]
        ),
        (&json!(409), &json!("sold_out"))
    );

    // The batch itself: empty, too large, malformed.
    let (status, body) = api.post(&batches, json!({"reservations": []})).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let many: Vec<Value> = (0..=256)
        .map(|i| member("u9", 1, &format!("m{i}")))
        .collect();
    let (status, body) = api.post(&batches, json!({"reservations": many})).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let (status, body) = api.post(&batches, json!({"orders": []})).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_json"))
    );
    Ok(())
}

#[tokio::test]
async fn the_api_needs_its_token_and_stock_changes_need_the_admin_token() -> anyhow::Result<()> {
    let api = Api::start().await?;
    let reserve = format!("{}{}", api.base, api.reservations());
    let adjust = format!("{}/v1/sales/{}/items/PHONE/adjustments", api.base, api.sale);
    let order = json!({"sku": "PHONE", "user": "u9", "quantity": 1, "requestId": "t1"});
    let adjustment = json!({"delta": 5, "reason": "restock"});
    let status = |client: Client, url: String, body: Value| async move {
        let response = client.post(url).json(&body).send().await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        anyhow::Ok((status, body["error"].as_str().map(str::to_owned)))
    };
    let none = Client::new();
    let wrong = client_with("not-the-token-at-all")?;
    let gateway = client_with(API_TOKEN)?;
    assert_eq!(
        status(none.clone(), reserve.clone(), order.clone()).await?,
        (StatusCode::UNAUTHORIZED, Some("unauthorized".to_owned()))
    );
    assert_eq!(
        status(wrong, reserve.clone(), order.clone()).await?.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(gateway.clone(), reserve, order).await?.0,
        StatusCode::CREATED
    );
    // The gateway's token cannot add stock or reload a sale.
    assert_eq!(
        status(gateway.clone(), adjust.clone(), adjustment.clone()).await?,
        (StatusCode::FORBIDDEN, Some("forbidden".to_owned()))
    );
    let load = json!({"sale": api.sale, "reservationTtlMs": 1,
                      "items": [{"sku": "PHONE", "stock": 999, "perUserLimit": 99, "shards": 1}]});
    assert_eq!(
        status(gateway, format!("{}/v1/sales", api.base), load)
            .await?
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        status(none, adjust.clone(), adjustment.clone()).await?.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(api.http.clone(), adjust, adjustment).await?.0,
        StatusCode::OK
    );
    Ok(())
}

#[tokio::test]
async fn buyers_named_by_email_uuid_or_provider_subject_can_reserve() -> anyhow::Result<()> {
    let api = Api::start().await?;
    for (n, user) in [
        "ann.buyer+sale@example.com",
        "0b5e7c1a-58f4-4f7e-9a43-3c1d2e4f5a6b",
        "auth0|64f1c2d3e4",
    ]
    .into_iter()
    .enumerate()
    {
        let (status, body) = api.reserve(user, 1, &format!("r{n}")).await?;
        assert_eq!(
            (status, body["user"].as_str()),
            (StatusCode::CREATED, Some(user)),
            "{body}"
        );
    }
    // Outside the rule (see flashsale_orders::user): refused before any stock moves.
    for user in [
        "josé@example.com",
        "ann buyer",
        "ann\nbuyer",
        "a/b",
        &"u".repeat(129),
    ] {
        let (status, body) = api.reserve(user, 1, "r-refused").await?;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{user:?}: {body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains("user"), "{user:?}: {message}");
    }
    Ok(())
}
