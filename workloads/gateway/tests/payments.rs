//! Payments come from the payment provider's signed callback, never from
//! the buyer: against a real inventory, Redis and Kafka.

mod common;

use common::{Funnel, Options, events, http, now_s, order, provider_pays, token};
use flashsale_orders::EventKind;
use serde_json::{Value, json};

/// The reservation's state straight from the inventory.
async fn state_of(funnel: &Funnel, order_id: &str) -> anyhow::Result<String> {
    let id = flashsale_orders::reservation_id(order_id).unwrap_or_default();
    let record: Value = http()
        .get(format!(
            "{}/v1/sales/{}/reservations/{id}",
            funnel.inventory.url, funnel.sale
        ))
        .bearer_auth(common::INVENTORY_TOKEN)
        .send()
        .await?
        .json()
        .await?;
    Ok(record["state"].as_str().unwrap_or_default().to_owned())
}

fn paid_events(events: &[flashsale_orders::OrderEvent]) -> usize {
    events.iter().filter(|e| e.kind == EventKind::Paid).count()
}

#[tokio::test]
async fn the_buyer_cannot_mark_an_order_paid() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let gw = &funnel.gateway.url;
    let (status, body, _) = order(gw, "gus", "A", "k1", None).await?;
    assert_eq!(status, 201, "{body}");
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();
    for _ in 0..3 {
        let answer = http()
            .post(format!("{gw}/api/v1/orders/{order_id}/pay"))
            .bearer_auth(token("gus"))
            .send()
            .await?;
        assert_eq!(answer.status().as_u16(), 202);
    }
    assert_eq!(state_of(&funnel, &order_id).await?, "reserved");
    assert_eq!(
        paid_events(&events(&funnel.brokers, &funnel.topic).await?),
        0
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn a_callback_must_be_signed_fresh_and_for_the_right_amount() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let gw = &funnel.gateway.url;
    let (_, body, _) = order(gw, "hal", "A", "k1", None).await?;
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();

    // Unsigned, or signed with the wrong secret: 401.
    let unsigned = http()
        .post(format!("{gw}/api/v1/payments/callback"))
        .json(
            &json!({"paymentId": "p", "orderId": order_id, "amountMinor": 1999,
                      "currency": "CNY", "status": "succeeded"}),
        )
        .send()
        .await?;
    assert_eq!(unsigned.status().as_u16(), 401);
    // Signed too long ago (a replay): 401.
    let (status, stale) = provider_pays(gw, &order_id, 1999, "CNY", now_s() - 3600).await?;
    assert_eq!(
        (status, stale["error"].as_str()),
        (401, Some("bad_signature")),
        "{stale}"
    );
    // The wrong amount or currency: 409, and nothing confirmed.
    let (status, short) = provider_pays(gw, &order_id, 1, "CNY", now_s()).await?;
    assert_eq!(
        (status, short["error"].as_str()),
        (409, Some("amount_mismatch")),
        "{short}"
    );
    let (status, dollars) = provider_pays(gw, &order_id, 1999, "USD", now_s()).await?;
    assert_eq!(
        (status, dollars["error"].as_str()),
        (409, Some("amount_mismatch")),
        "{dollars}"
    );
    assert_eq!(state_of(&funnel, &order_id).await?, "reserved");
    assert_eq!(
        paid_events(&events(&funnel.brokers, &funnel.topic).await?),
        0
    );

    // The right one pays it, and the paid event carries the order's amount.
    let (status, paid) = provider_pays(gw, &order_id, 1999, "CNY", now_s()).await?;
    assert_eq!((status, &paid["status"]), (200, &json!("paid")), "{paid}");
    assert_eq!(state_of(&funnel, &order_id).await?, "confirmed");
    let stored = events(&funnel.brokers, &funnel.topic).await?;
    let paid: Vec<_> = stored
        .iter()
        .filter(|e| e.kind == EventKind::Paid)
        .collect();
    assert_eq!(paid.len(), 1, "{stored:?}");
    assert_eq!(
        (paid[0].order_id.as_str(), paid[0].amount_minor),
        (order_id.as_str(), 1999)
    );
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_payment_callbacks_total{outcome="unauthenticated"}"#),
        Some(2.0)
    );

    // An unknown order is a 404 to the provider.
    let (status, _) = provider_pays(gw, "ord-nosuchreservation", 1999, "CNY", now_s()).await?;
    assert_eq!(status, 404);
    funnel.cleanup().await
}
