//! The flash-sale gateway: the only public entry, shedding load cheaply before it reaches stock or orders.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{ArgGroup, Parser};
use flashsale_orders::ProducerSettings;
use flashsale_runtime::{Process, Readiness, RuntimeArgs};
use gateway::{
    auth::Verifier,
    config::GatewayConfig,
    server::{Gateway, Settings, SwitchSource},
};

/// The flash-sale gateway: the only public entry, shedding load cheaply before it reaches stock or orders.
///
/// In order, each as cheap as possible: degraded feature routes answer from
/// their switch; the per-user rate limit answers 429; without a pass the
/// waiting room answers 202 with a ticket; over the adaptive concurrency
/// limit the answer is 503. What passes reserves stock and publishes the
/// order event before it is acknowledged.
#[derive(Debug, Parser)]
#[command(name = "gateway", version)]
#[command(group(ArgGroup::new("jwt").required(true).multiple(true).args(["jwt_hs256_secret_file", "jwt_rs256_public_key_file", "jwt_jwks_file"])))]
#[command(group(ArgGroup::new("switch_source").args(["degradation_file", "degradation_config_map"])))]
struct Args {
    /// Address of the public API.
    #[arg(long, env = "GATEWAY_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// The sale's gateway configuration (JSON: sale, items with prices,
    /// rateLimit, waitingRoom, concurrency, requestTimeoutMs, itemCacheMs).
    #[arg(long, env = "GATEWAY_CONFIG")]
    config: PathBuf,
    /// Redis shared by the replicas (rate limit, waiting room): one server
    /// (`redis://host:port`) or a cluster (a comma-separated list of nodes,
    /// or `redis+cluster://host:port`). Without it each replica rate-limits
    /// alone and the waiting room is unavailable.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// Base URL of the inventory service.
    #[arg(long, env = "INVENTORY_URL")]
    inventory_url: String,
    /// File holding the token the inventory API requires (sent as a bearer token).
    #[arg(long, env = "INVENTORY_API_TOKEN_FILE")]
    inventory_token_file: Option<PathBuf>,
    /// File holding the secret the payment provider signs its callbacks with
    /// (at least 32 bytes); without it payment callbacks are refused.
    #[arg(long, env = "PAYMENT_SECRET_FILE")]
    payment_secret_file: Option<PathBuf>,
    /// Kafka bootstrap servers for order events.
    #[arg(long, env = "KAFKA_BROKERS")]
    kafka_brokers: String,
    /// Topic of order events.
    #[arg(long, env = "ORDERS_TOPIC", default_value = "flashsale.orders")]
    orders_topic: String,
    /// File holding the HS256 secret that signs bearer tokens (at least 32 bytes).
    #[arg(long, env = "JWT_HS256_SECRET_FILE", conflicts_with_all = ["jwt_rs256_public_key_file", "jwt_jwks_file"])]
    jwt_hs256_secret_file: Option<PathBuf>,
    /// File holding the PEM RSA public key of the token issuer (RS256). With
    /// --jwt-jwks-file too, it checks the tokens that name no `kid`.
    #[arg(long, env = "JWT_RS256_PUBLIC_KEY_FILE")]
    jwt_rs256_public_key_file: Option<PathBuf>,
    /// File holding the token issuer's JSON Web Key Set (RS256): the token's
    /// `kid` chooses the key, an unknown `kid` is refused. Re-read every 10 s,
    /// so keys rotate with the Secret, without a restart.
    #[arg(long, env = "JWT_JWKS_FILE")]
    jwt_jwks_file: Option<PathBuf>,
    /// Required `iss` claim.
    #[arg(long, env = "JWT_ISSUER")]
    jwt_issuer: Option<String>,
    /// Required `aud` claim.
    #[arg(long, env = "JWT_AUDIENCE")]
    jwt_audience: Option<String>,
    /// File holding the sale's drill key (at least 32 bytes): tokens signed
    /// with it are drill buyers', who order only the drill SKU. A path with
    /// no file behind it (an older sale's Secret) means no drill orders.
    #[arg(long, env = "DRILL_BUYER_KEY_FILE")]
    drill_buyer_key_file: Option<PathBuf>,
    /// File holding the waiting room's HMAC key (at least 32 bytes).
    #[arg(long, env = "WAITING_ROOM_KEY_FILE")]
    waiting_room_key_file: Option<PathBuf>,
    /// Degradation switches from this file (the ConfigMap's data as YAML or
    /// JSON), polled; for runs outside a cluster.
    #[arg(long, env = "DEGRADATION_FILE")]
    degradation_file: Option<PathBuf>,
    /// Degradation switches from this ConfigMap, watched through the API.
    #[arg(long, env = "DEGRADATION_CONFIG_MAP")]
    degradation_config_map: Option<String>,
    /// Namespace of that ConfigMap.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    namespace: String,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

/// How often the JWT key set file is re-read (a Secret update reaches the
/// pod's file within about a minute anyway).
const JWKS_RELOAD_EVERY: Duration = Duration::from_secs(10);

fn read(path: &PathBuf, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading the {what} {}", path.display()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut process = Process::start("gateway", env!("CARGO_PKG_VERSION"), &args.runtime.log)?;
    let settings = settings(&args)?;
    let gateway = Gateway::build(settings, args.listen, process.registry_mut()).await?;
    let shutdown = process.shutdown();
    // No dependency checks: a gateway that cannot reach the inventory still
    // sheds and serves degraded routes, and taking every replica out of
    // rotation at once would turn a partial outage into a total one.
    let (served, ops) = tokio::join!(
        gateway.serve(shutdown),
        process.serve_ops(&args.runtime.ops, Readiness::default())
    );
    served.context("public API failed")?;
    ops?;
    Ok(())
}

/// Everything the gateway is built from: the arguments and the files they
/// name. A JWT key set file is watched from now on.
fn settings(args: &Args) -> anyhow::Result<Settings> {
    let config = GatewayConfig::load(&args.config)?;
    let verifier = match drill_buyers(args, &config.sale)? {
        Some(checker) => verifier(args)?.with_drill_buyers(checker),
        None => verifier(args)?,
    };
    let ticket_key = match &args.waiting_room_key_file {
        Some(path) => Some(read(path, "waiting-room key")?.trim_ascii().to_vec()),
        None => None,
    };
    let switches = match (&args.degradation_file, &args.degradation_config_map) {
        (Some(path), _) => SwitchSource::File(path.clone()),
        (None, Some(name)) => SwitchSource::ConfigMap {
            namespace: args.namespace.clone(),
            name: name.clone(),
        },
        (None, None) => SwitchSource::None,
    };
    let inventory_token = match &args.inventory_token_file {
        Some(path) => Some(
            String::from_utf8(read(path, "inventory token")?)
                .context("the inventory token is not UTF-8")?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let payment_secret = match &args.payment_secret_file {
        Some(path) => Some(read(path, "payment secret")?.trim_ascii().to_vec()),
        None => {
            tracing::warn!(
                "no payment secret: payment callbacks are refused, so no order can be paid"
            );
            None
        }
    };
    let mut producer = ProducerSettings::new(args.kafka_brokers.clone());
    producer.topic = args.orders_topic.clone();
    Ok(Settings {
        config,
        redis_url: args.redis_url.clone(),
        inventory_url: args.inventory_url.clone(),
        inventory_token,
        payment_secret,
        producer,
        verifier,
        ticket_key,
        switches,
    })
}

/// The checker of sale `sale`'s drill buyer tokens, when its key file is
/// there.
fn drill_buyers(args: &Args, sale: &str) -> anyhow::Result<Option<flashsale_drill_buyer::Checker>> {
    let Some(path) = &args.drill_buyer_key_file else {
        return Ok(None);
    };
    if !path.exists() {
        tracing::warn!(path = %path.display(), "no drill key: drill orders are refused");
        return Ok(None);
    }
    let key = read(path, "drill key")?;
    Ok(Some(flashsale_drill_buyer::Checker::new(&key, sale)?))
}

/// The bearer-token verifier of the arguments (HS256 secret, or RS256 key
/// and/or key set, with the required claims). The key set file, if any, is
/// re-read from now on so keys rotate without a restart.
fn verifier(args: &Args) -> anyhow::Result<Verifier> {
    let jwks = match &args.jwt_jwks_file {
        Some(path) => Some((path.clone(), read(path, "JWT key set")?)),
        None => None,
    };
    let mut verifier = match (&args.jwt_hs256_secret_file, &args.jwt_rs256_public_key_file) {
        (Some(path), _) => Verifier::hs256(read(path, "JWT secret")?.trim_ascii())?,
        (None, pem) => {
            let pem = pem
                .as_ref()
                .map(|p| read(p, "JWT public key"))
                .transpose()?;
            Verifier::rs256(pem.as_deref(), jwks.as_ref().map(|(_, set)| set.as_slice()))?
        }
    };
    if let Some(issuer) = &args.jwt_issuer {
        verifier = verifier.with_issuer(issuer);
    }
    if let Some(audience) = &args.jwt_audience {
        verifier = verifier.with_audience(audience);
    }
    if let Some((path, loaded)) = jwks {
        tokio::spawn(
            verifier
                .clone()
                .watch_jwks_file(path, loaded, JWKS_RELOAD_EVERY),
        );
    }
    Ok(verifier)
}
