//! What each workload runs: its container (image, env, mounts) and pod
//! template. Env names follow each binary's clap flags
//! (workloads/*/src/main.rs).

use k8s_openapi::{
    api::core::v1::{Container, EnvVar, PodSpec, PodTemplateSpec, Volume, VolumeMount},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{
    BuildError, Images, Owner,
    config::{GATEWAY_CONFIG_KEY, INVENTORY_CONFIG_KEY, Rendered},
    internal::{ADMIN_TOKEN_KEY, API_TOKEN_KEY, drill_volume, internal_file, internal_volume},
    labels,
    names::{self, Component},
    pod::{self, CONFIG_DIR, HTTP_PORT, SECRET_FILE, env, env_field, env_secret},
};
use flashsale_api::{
    FlashSale, common::WorkloadSpec, flashsale::GatewayAuth, flashsale::GatewaySpec,
    flashsale::RedisSpec,
};

/// Where the gateway's token key is mounted.
const JWT_DIR: &str = "/etc/flashsale/jwt";
/// Where the payment provider's signing secret is mounted, as the file
/// `secret`.
const PAYMENT_DIR: &str = "/etc/flashsale/payment";
const PAYMENT_FILE: &str = "secret";
/// Where the waiting room's HMAC key is mounted.
const WAITING_ROOM_DIR: &str = "/etc/flashsale/waiting-room";
/// The env variable naming the inventory API token's file, in the gateway
/// (the token it sends) and the inventory (the token it takes) alike.
const API_TOKEN_ENV: &str = "INVENTORY_API_TOKEN_FILE";
/// The env variable naming the inventory admin token's file.
const ADMIN_TOKEN_ENV: &str = "INVENTORY_ADMIN_TOKEN_FILE";
/// Every binary logs one JSON object per line in a cluster.
const LOG_FORMAT: (&str, &str) = ("LOG_FORMAT", "json");

/// The spec's size, image and resources of a workload.
pub(super) fn workload_spec(sale: &FlashSale, component: Component) -> &WorkloadSpec {
    match component {
        Component::Gateway => &sale.spec.gateway.workload,
        Component::Inventory => &sale.spec.inventory.workload,
        Component::OrderWriter => &sale.spec.order_writer.workload,
    }
}

/// The spec's image, or the operator's default for the workload.
fn image(sale: &FlashSale, images: &Images, component: Component) -> String {
    let default = match component {
        Component::Gateway => &images.gateway,
        Component::Inventory => &images.inventory,
        Component::OrderWriter => &images.order_writer,
    };
    workload_spec(sale, component)
        .image
        .clone()
        .unwrap_or_else(|| default.clone())
}

/// What differs between the workloads' pods.
struct PodParts {
    env: Vec<EnvVar>,
    volumes: Vec<(Volume, VolumeMount)>,
    config_hash: String,
    /// Only the gateway talks to the Kubernetes API; the others get no token.
    service_account: Option<String>,
}

fn template(
    owner: &Owner<'_>,
    images: &Images,
    component: Component,
    parts: PodParts,
) -> PodTemplateSpec {
    let (volumes, mounts): (Vec<_>, Vec<_>) = parts.volumes.into_iter().unzip();
    let container = Container {
        name: component.label().to_owned(),
        image: Some(image(owner.sale, images, component)),
        ports: Some(pod::container_ports(component)),
        env: Some(parts.env),
        volume_mounts: Some(mounts).filter(|m| !m.is_empty()),
        readiness_probe: Some(pod::readiness_probe()),
        liveness_probe: Some(pod::liveness_probe()),
        resources: Some(pod::resources(
            workload_spec(owner.sale, component).resources.as_ref(),
            component,
        )),
        security_context: Some(pod::security_context()),
        ..Container::default()
    };
    let selector = labels::selector(owner.name, component);
    let placement = owner.sale.spec.placement.as_ref();
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels::labels(owner.name, component)),
            annotations: Some(pod::annotations(parts.config_hash)),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            automount_service_account_token: Some(parts.service_account.is_some()),
            service_account_name: parts.service_account,
            containers: vec![container],
            volumes: Some(volumes).filter(|v| !v.is_empty()),
            // Service links would put every Service of the namespace into the
            // env; the workloads find each other by DNS.
            enable_service_links: Some(false),
            security_context: Some(pod::pod_security_context()),
            topology_spread_constraints: Some(vec![pod::topology_spread(&selector)]),
            node_selector: placement
                .map(|p| p.node_selector.clone())
                .filter(|s| !s.is_empty()),
            tolerations: placement
                .map(|p| p.tolerations.clone())
                .filter(|t| !t.is_empty()),
            ..PodSpec::default()
        }),
    }
}

fn redis_url(field: &'static str, redis: &RedisSpec) -> Result<EnvVar, BuildError> {
    match (&redis.url, &redis.url_secret_ref) {
        (Some(url), None) => Ok(env("REDIS_URL", url.as_str())),
        (None, Some(secret)) => Ok(env_secret("REDIS_URL", secret)),
        _ => Err(BuildError::InvalidSpec {
            field,
            reason: "needs exactly one of url and urlSecretRef",
        }),
    }
}

/// The env variable naming the token key file, and the key's Secret.
fn jwt_key(
    auth: &GatewayAuth,
) -> Result<(&'static str, &flashsale_api::common::SecretKeyRef), BuildError> {
    match (&auth.hs256_secret_ref, &auth.rs256_public_key_secret_ref) {
        (Some(secret), None) => Ok(("JWT_HS256_SECRET_FILE", secret)),
        (None, Some(secret)) => Ok(("JWT_RS256_PUBLIC_KEY_FILE", secret)),
        _ => Err(BuildError::InvalidSpec {
            field: "spec.gateway.auth",
            reason: "needs exactly one of hs256SecretRef and rs256PublicKeySecretRef",
        }),
    }
}

/// The gateway's parts that only some specs have: the payment provider's
/// secret, the token issuer and audience, the waiting room's key.
fn optional_parts(
    gateway: &GatewaySpec,
    env: &mut Vec<EnvVar>,
    volumes: &mut Vec<(Volume, VolumeMount)>,
) -> Result<(), BuildError> {
    if let Some(payment) = &gateway.payment {
        let secret = &payment.secret_ref;
        volumes.push(pod::secret_files(
            "payment",
            PAYMENT_DIR,
            &secret.name,
            &[(&secret.key, PAYMENT_FILE)],
        ));
        env.push(pod::env(
            "PAYMENT_SECRET_FILE",
            format!("{PAYMENT_DIR}/{PAYMENT_FILE}"),
        ));
    }
    if let Some(issuer) = &gateway.auth.issuer {
        env.push(pod::env("JWT_ISSUER", issuer.as_str()));
    }
    if let Some(audience) = &gateway.auth.audience {
        env.push(pod::env("JWT_AUDIENCE", audience.as_str()));
    }
    // The key signs the room's tickets and passes, and the bot shield's
    // challenges, which guard every order when the room is off.
    let room = &gateway.waiting_room;
    if room.signs() {
        let secret = room
            .ticket_secret_ref
            .as_ref()
            .ok_or(BuildError::InvalidSpec {
                field: "spec.gateway.waitingRoom.ticketSecretRef",
                reason: "is required when the waiting room or its bot shield is on",
            })?;
        volumes.push(pod::secret_volume("waiting-room", WAITING_ROOM_DIR, secret));
        env.push(pod::env(
            "WAITING_ROOM_KEY_FILE",
            format!("{WAITING_ROOM_DIR}/{SECRET_FILE}"),
        ));
    }
    Ok(())
}

/// The gateway's pod template.
pub(super) fn gateway(
    owner: &Owner<'_>,
    images: &Images,
    config: &Rendered,
) -> Result<PodTemplateSpec, BuildError> {
    let spec = &owner.sale.spec;
    let gateway = &spec.gateway;
    let kafka = &spec.order_writer.kafka;
    let (jwt_env, jwt_secret) = jwt_key(&gateway.auth)?;
    let (drill, drill_file) = drill_volume(owner);
    let mut volumes = vec![
        pod::config_volume("config", names::gateway_config(owner.sale)),
        pod::secret_volume("jwt", JWT_DIR, jwt_secret),
        // The API token only: the gateway never loads sales or adjusts stock.
        internal_volume(owner, &[API_TOKEN_KEY]),
        drill,
    ];
    let mut env = vec![
        env(LOG_FORMAT.0, LOG_FORMAT.1),
        env(
            "GATEWAY_CONFIG",
            format!("{CONFIG_DIR}/{GATEWAY_CONFIG_KEY}"),
        ),
        env(
            "INVENTORY_URL",
            format!(
                "http://{}:{HTTP_PORT}",
                names::workload(owner.sale, Component::Inventory)
            ),
        ),
        env(API_TOKEN_ENV, internal_file(API_TOKEN_KEY)),
        env("DRILL_BUYER_KEY_FILE", drill_file),
        env("KAFKA_BROKERS", kafka.brokers.join(",")),
        env("ORDERS_TOPIC", kafka.topic.as_str()),
        // The gateway's own Redis user when it has one, so the internet-facing
        // workload holds no login that reaches the stock.
        match &gateway.redis {
            Some(redis) => redis_url("spec.gateway.redis", redis)?,
            None => redis_url("spec.inventory.redis", &spec.inventory.redis)?,
        },
        env(jwt_env, format!("{JWT_DIR}/{SECRET_FILE}")),
    ];
    optional_parts(gateway, &mut env, &mut volumes)?;
    env.push(pod::env(
        "DEGRADATION_CONFIG_MAP",
        names::degradation(owner.sale),
    ));
    env.push(env_field("POD_NAMESPACE", "metadata.namespace"));
    Ok(template(
        owner,
        images,
        Component::Gateway,
        PodParts {
            env,
            volumes,
            config_hash: config.hash.clone(),
            service_account: Some(names::gateway_service_account(owner.sale)),
        },
    ))
}

/// The inventory's pod template.
pub(super) fn inventory(
    owner: &Owner<'_>,
    images: &Images,
    config: &Rendered,
) -> Result<PodTemplateSpec, BuildError> {
    let kafka = &owner.sale.spec.order_writer.kafka;
    let durability = &owner.sale.spec.inventory.durability;
    let env = vec![
        env(LOG_FORMAT.0, LOG_FORMAT.1),
        redis_url("spec.inventory.redis", &owner.sale.spec.inventory.redis)?,
        env("INVENTORY_DURABILITY", durability.mode.flag()),
        env(
            "INVENTORY_DURABILITY_REPLICAS",
            durability.replicas.to_string(),
        ),
        env(
            "INVENTORY_DURABILITY_TIMEOUT_MS",
            durability.timeout.0.as_millis().to_string(),
        ),
        env(
            "INVENTORY_SALE_FILE",
            format!("{CONFIG_DIR}/{INVENTORY_CONFIG_KEY}"),
        ),
        // Where it publishes an `expired` order event for every reservation
        // that lapses unpaid: the topic the gateway and order-writer use.
        env("KAFKA_BROKERS", kafka.brokers.join(",")),
        env("ORDERS_TOPIC", kafka.topic.as_str()),
        env(API_TOKEN_ENV, internal_file(API_TOKEN_KEY)),
        env(ADMIN_TOKEN_ENV, internal_file(ADMIN_TOKEN_KEY)),
    ];
    Ok(template(
        owner,
        images,
        Component::Inventory,
        PodParts {
            env,
            volumes: vec![
                pod::config_volume("config", names::inventory_config(owner.sale)),
                internal_volume(owner, &[API_TOKEN_KEY, ADMIN_TOKEN_KEY]),
            ],
            config_hash: config.hash.clone(),
            service_account: None,
        },
    ))
}

/// The order-writer's pod template. It has no ConfigMap: its settings are
/// all env, so its config hash covers them.
pub(super) fn order_writer(
    owner: &Owner<'_>,
    images: &Images,
) -> Result<PodTemplateSpec, BuildError> {
    let writer = &owner.sale.spec.order_writer;
    let env = vec![
        env(LOG_FORMAT.0, LOG_FORMAT.1),
        env("KAFKA_BROKERS", writer.kafka.brokers.join(",")),
        env(
            "ORDER_WRITER_GROUP",
            names::order_writer_group(owner.namespace, owner.name),
        ),
        env("ORDER_TOPIC", writer.kafka.topic.as_str()),
        env("ORDER_DLQ_TOPIC", writer.kafka.dlq_topic.as_str()),
        env_secret("DATABASE_URL", &writer.database.url_secret_ref),
        env(
            "ORDER_WRITER_BATCH_SIZE",
            writer.database.batch_size.to_string(),
        ),
        env(
            "ORDER_WRITER_FLUSH_INTERVAL_MS",
            writer.database.flush_interval.0.as_millis().to_string(),
        ),
    ];
    let config_hash = super::config::config_hash(&serde_json::to_string(&env)?);
    Ok(template(
        owner,
        images,
        Component::OrderWriter,
        PodParts {
            env,
            volumes: Vec::new(),
            config_hash,
            service_account: None,
        },
    ))
}
