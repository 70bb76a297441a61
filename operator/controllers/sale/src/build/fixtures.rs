//! Test sales with fixed metadata, so snapshots are stable.

use super::Images;
use flashsale_api::FlashSale;

/// Fixed default images.
pub(super) fn images() -> Images {
    Images {
        gateway: "ghcr.io/flashsale-dev/gateway:0.1.0".to_owned(),
        inventory: "ghcr.io/flashsale-dev/inventory:0.1.0".to_owned(),
        order_writer: "ghcr.io/flashsale-dev/order-writer:0.1.0".to_owned(),
    }
}

fn parse(yaml: &str) -> anyhow::Result<FlashSale> {
    Ok(serde_yaml_ng::from_str(yaml)?)
}

/// A big live sale: autoscaling, waiting room, HS256 with issuer and
/// audience, a payment provider's secret, Redis URL from a Secret, MySQL.
pub(super) fn big_sale() -> anyhow::Result<FlashSale> {
    parse(
        r#"
apiVersion: flashsale.dev/v1alpha1
kind: FlashSale
metadata:
  name: singles-day
  namespace: shop
  uid: 6f1c5b8e-2b1a-4c3d-9e8f-000000000001
  creationTimestamp: "2026-11-01T08:00:00Z"
  generation: 3
spec:
  schedule:
    start: "2026-11-11T00:00:00+08:00"
    end: "2026-11-11T02:00:00+08:00"
    warmUp: 30m
  currency: CNY
  reservationTTL: 15m
  region: cn-east-1
  items:
    - {sku: PHONE-X-256, stock: 10000, perUserLimit: 1, priceMinor: 399900, shards: 8}
    - {sku: PHONE-CASE, stock: 200000, perUserLimit: 5, priceMinor: 3900}
  gateway:
    auth:
      hs256SecretRef: {name: singles-day-jwt, key: hs256}
      issuer: https://login.example.com
      audience: flashsale
    payment:
      secretRef: {name: singles-day-payment, key: webhook-secret}
    autoscaling: {minReplicas: 6, maxReplicas: 60, targetCPUUtilizationPercent: 60}
    resources:
      requests: {cpu: 500m, memory: 256Mi}
      limits: {memory: 512Mi}
    rateLimit: {perUserPerSecond: 2.5, burst: 5}
    waitingRoom:
      enabled: true
      admitPerSecond: 2000
      ticketSecretRef: {name: singles-day-waiting-room, key: hmac-key}
      passTTL: 5m
    concurrency: {minLimit: 50, maxLimit: 2000, tier0ReservedPercent: 40}
  inventory:
    replicas: 4
    redis:
      urlSecretRef: {name: singles-day-redis, key: url}
  orderWriter:
    replicas: 6
    kafka:
      brokers: ["kafka-0.kafka:9092", "kafka-1.kafka:9092"]
      topic: flashsale.orders
      dlqTopic: flashsale.orders.dlq
    database:
      driver: mysql
      urlSecretRef: {name: singles-day-db, key: url}
      batchSize: 200
      flushInterval: 50ms
"#,
    )
}

/// A small sale: no autoscaling, RS256, plain Redis URL, no waiting room,
/// PostgreSQL, a gateway image override, dedicated nodes, defaults elsewhere.
pub(super) fn small_sale() -> anyhow::Result<FlashSale> {
    parse(
        r#"
apiVersion: flashsale.dev/v1alpha1
kind: FlashSale
metadata:
  name: weekend-deal
  namespace: shop
  uid: 6f1c5b8e-2b1a-4c3d-9e8f-000000000002
  creationTimestamp: "2026-06-01T09:30:00Z"
spec:
  schedule:
    start: "2026-06-06T10:00:00Z"
    end: "2026-06-06T12:00:00Z"
  region: eu-west-1
  placement:
    nodeSelector: {pool: sales}
    tolerations:
      - {key: dedicated, operator: Equal, value: sales, effect: NoSchedule}
  items:
    - {sku: KETTLE, stock: 500, priceMinor: 2999}
  gateway:
    replicas: 3
    image: registry.example.com/gateway:patched
    auth:
      rs256PublicKeySecretRef: {name: weekend-deal-jwt, key: public.pem}
  inventory:
    redis: {url: "redis://redis.shop:6379/0"}
  orderWriter:
    kafka: {brokers: ["kafka.shop:9092"]}
    database:
      driver: postgres
      urlSecretRef: {name: weekend-deal-db, key: url}
"#,
    )
}
