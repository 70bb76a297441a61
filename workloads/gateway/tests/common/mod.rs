//! A whole funnel for one test: a real inventory (in this process, on the
//! stack's Redis) with a freshly loaded sale, a fresh Kafka topic, and a
//! gateway in front of them, all on loopback. The funnel is the one the
//! benchmarks and the play's buyers use (`flashsale_bench::funnel`); what
//! does not need the gateway's or the inventory's types (the sale's plan,
//! the secrets, what a client does) is the test kit's
//! (`flashsale_e2e::funnel`). What only these tests do is here.

#![allow(dead_code)] // each test binary uses its own subset

#[allow(unused_imports)] // each test binary uses its own subset
pub use flashsale_bench::funnel::{Funnel, Options, Running, acl_user};
#[allow(unused_imports)] // each test binary uses its own subset
pub use flashsale_e2e::funnel::{
    DRILL_KEY, INVENTORY_TOKEN, ITEMS, JWT_SECRET, PAYMENT_SECRET, ROOM_KEY, TopicSpec,
    create_topic, drill_order, events, http, now_s, order, ticket_user, token, wait_for_pass,
    wait_past,
};
use serde_json::Value;

/// The test payment provider: posts a signed callback saying `order_id`
/// was paid `amount_minor` in `currency`, signed at `signed_at` (Unix s).
pub async fn provider_pays(
    gateway: &str,
    order_id: &str,
    amount_minor: i64,
    currency: &str,
    signed_at: i64,
) -> anyhow::Result<(u16, Value)> {
    let body = gateway::payments::succeeded(order_id, u64::try_from(amount_minor)?, currency);
    let signature = gateway::payments::sign(PAYMENT_SECRET, signed_at, &body)?;
    let response = http()
        .post(format!("{gateway}/api/v1/payments/callback"))
        .header(gateway::payments::SIGNATURE_HEADER, signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}
