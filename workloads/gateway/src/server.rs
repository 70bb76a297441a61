//! Assembles a gateway from its settings: connections, the shedding layers,
//! the background loops, and the listener. The binary and the tests build a
//! gateway the same way.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use flashsale_orders::{OrderProducer, ProducerSettings};
use flashsale_runtime::{RedisConnection, RedisTarget, RedisTimeouts, Shutdown};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::{
    app::{self, AppState, Inner},
    auth::Verifier,
    bot_shield::{Shield, source::SourceBudget},
    clock::SaleClock,
    concurrency::ConcurrencyLimiter,
    config::GatewayConfig,
    degradation::{self, Switchboard},
    features::ChatThrottle,
    inventory_client::InventoryClient,
    items::ItemCache,
    metrics::GatewayMetrics,
    payments::PaymentVerifier,
    ratelimit::RateLimiter,
    waiting_room::{self, OrderSpends, Signer, WaitingRoom},
};

/// How often each replica moves the waiting room's admission frontier and
/// refreshes its gauges.
const TICK: Duration = Duration::from_millis(100);

/// Why a gateway could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Redis URL or first connection.
    #[error("connecting to Redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The Redis URL names no server.
    #[error(transparent)]
    RedisUrl(#[from] flashsale_runtime::redis::InvalidRedisUrl),
    /// The waiting room, or its bot shield, is on but cannot run.
    #[error("waiting room: {0}")]
    WaitingRoom(String),
    /// The Kafka producer could not be created.
    #[error(transparent)]
    Producer(#[from] flashsale_orders::ProduceError),
    /// The inventory client could not be created.
    #[error("inventory client: {0}")]
    Inventory(#[from] crate::inventory_client::ClientError),
    /// The payment secret cannot be used.
    #[error("payment secret: {0}")]
    Payments(#[from] crate::payments::SignatureError),
    /// The Kubernetes client could not be created.
    #[error("kubernetes client for the degradation ConfigMap: {0}")]
    Kube(#[from] kube::Error),
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// OS error.
        source: std::io::Error,
    },
}

/// Where the degradation switches come from.
#[derive(Debug, Clone)]
pub enum SwitchSource {
    /// Fixed at tier 0 (a single local run).
    None,
    /// A file with the ConfigMap's data, polled.
    File(PathBuf),
    /// The `<sale>-degradation` ConfigMap, watched through the API.
    ConfigMap {
        /// Namespace of the sale.
        namespace: String,
        /// ConfigMap name.
        name: String,
    },
}

/// Everything a gateway is built from.
pub struct Settings {
    /// The sale's configuration.
    pub config: GatewayConfig,
    /// Redis for the shared rate limit and the waiting room.
    pub redis_url: Option<String>,
    /// The inventory's base URL.
    pub inventory_url: String,
    /// The token the inventory API requires, if any.
    pub inventory_token: Option<String>,
    /// The secret payment-provider callbacks are signed with; without it
    /// callbacks are refused.
    pub payment_secret: Option<Vec<u8>>,
    /// The order-event producer.
    pub producer: ProducerSettings,
    /// Bearer-token verification.
    pub verifier: Verifier,
    /// The waiting room's HMAC key (required when it is enabled).
    pub ticket_key: Option<Vec<u8>>,
    /// Degradation switches source.
    pub switches: SwitchSource,
}

/// A built gateway: state plus listener, not yet serving.
pub struct Gateway {
    /// The handlers' state (tests read its parts).
    pub state: AppState,
    listener: TcpListener,
    switches: SwitchSource,
    kube: Option<kube::Client>,
}

/// The sale's waiting room when its config turns one on: it keeps its
/// queue in `redis` and signs tickets with `ticket_key`.
fn open_waiting_room(
    config: &GatewayConfig,
    redis: Option<&RedisConnection>,
    ticket_key: Option<&[u8]>,
) -> Result<Option<WaitingRoom>, BuildError> {
    if !config.waiting_room.enabled {
        return Ok(None);
    }
    let (redis, signer) = redis_and_signer(redis, ticket_key, "it", "keeps its queue", "tickets")?;
    let mut room =
        waiting_room::Settings::new(config.sale.clone(), config.waiting_room.admit_per_second);
    room.pass_ttl = Duration::from_secs(config.waiting_room.pass_ttl_seconds);
    // An order takes at most its reserve budget plus the publish
    // bound (each the request timeout); the lease outlives both, so
    // only a crashed gateway's pass comes back by expiry.
    room.lease_ttl = config.request_timeout() * 2 + Duration::from_secs(3);
    Ok(Some(WaitingRoom::new(redis, signer, room)))
}

/// The bot shield when the sale's config has one: in front of `room`'s
/// joins, which spend its proofs; with no room, in front of every order,
/// each spending its own in `redis` (the second value), signed with
/// `ticket_key`.
fn open_bot_shield(
    config: &GatewayConfig,
    room: Option<&WaitingRoom>,
    redis: Option<&RedisConnection>,
    ticket_key: Option<&[u8]>,
) -> Result<(Option<Shield>, Option<OrderSpends>), BuildError> {
    let Some(shield) = &config.waiting_room.bot_shield else {
        return Ok((None, None));
    };
    if let Some(room) = room {
        return Ok((Some(Shield::new(room, shield.settings())), None));
    }
    let (redis, signer) = redis_and_signer(
        redis,
        ticket_key,
        "the bot shield",
        "spends proofs",
        "challenges",
    )?;
    let spends = OrderSpends::new(redis, &config.sale);
    let shield = Shield::signing(Arc::new(signer), config.sale.clone(), shield.settings());
    Ok((Some(shield), Some(spends)))
}

/// The Redis connection and the signer the waiting room and the bot shield
/// need; `who`, what it `keeps` in Redis and what it `signs` name them in
/// the error about a missing one.
fn redis_and_signer(
    redis: Option<&RedisConnection>,
    ticket_key: Option<&[u8]>,
    who: &str,
    keeps: &str,
    signs: &str,
) -> Result<(RedisConnection, Signer), BuildError> {
    let redis = redis.cloned().ok_or_else(|| {
        BuildError::WaitingRoom(format!("{who} {keeps} in Redis: give --redis-url"))
    })?;
    let key = ticket_key.ok_or_else(|| {
        BuildError::WaitingRoom(format!("{who} signs {signs}: give --waiting-room-key-file"))
    })?;
    let signer = Signer::new(key).map_err(|e| BuildError::WaitingRoom(e.to_string()))?;
    Ok((redis, signer))
}

/// The bot shield's per-source budget when the sale's config has one,
/// charged to `redis` and counted in `metrics`.
fn open_source_budget(
    config: &GatewayConfig,
    redis: Option<&RedisConnection>,
    metrics: &GatewayMetrics,
) -> Result<Option<SourceBudget>, BuildError> {
    let Some(per_source) = config
        .waiting_room
        .bot_shield
        .as_ref()
        .and_then(|shield| shield.per_source.as_ref())
    else {
        return Ok(None);
    };
    let (header, trusted) = per_source.parsed().map_err(BuildError::WaitingRoom)?;
    let limiter = RateLimiter::new(
        redis.cloned(),
        per_source.rate_settings(),
        metrics.rate_limit_charges("source"),
    );
    Ok(Some(SourceBudget::new(limiter, header, trusted)))
}

/// The gateway's Redis, when it has one.
async fn connect_redis(url: Option<&str>) -> Result<Option<RedisConnection>, BuildError> {
    let Some(url) = url else { return Ok(None) };
    let target: RedisTarget = url.parse()?;
    Ok(Some(
        RedisConnection::connect(&target, RedisTimeouts::default()).await?,
    ))
}

impl Gateway {
    /// Connects everything and binds `listen`.
    pub async fn build(
        settings: Settings,
        listen: SocketAddr,
        registry: &mut Registry,
    ) -> Result<Self, BuildError> {
        let redis = connect_redis(settings.redis_url.as_deref()).await?;
        let config = settings.config;
        let waiting_room =
            open_waiting_room(&config, redis.as_ref(), settings.ticket_key.as_deref())?;
        let inventory = InventoryClient::new(
            &settings.inventory_url,
            &config.sale,
            settings.inventory_token.as_deref(),
        )?;
        let payments = settings
            .payment_secret
            .as_deref()
            .map(PaymentVerifier::new)
            .transpose()?;
        let metrics = GatewayMetrics::register(registry);
        // The client gives up on a message when the request would: a message
        // it kept retrying after the order was answered 503 could still land.
        let producer = ProducerSettings {
            send_timeout: config.request_timeout(),
            replacements: metrics.producer_replacements(),
            ..settings.producer
        };
        let items = ItemCache::new(
            inventory.clone(),
            config.items.iter().map(|i| i.sku.clone()),
            Duration::from_millis(config.item_cache_ms),
            Duration::from_millis(config.sold_out_recheck_ms),
            metrics.clone(),
        );
        let kube = match &settings.switches {
            SwitchSource::ConfigMap { .. } => Some(kube::Client::try_default().await?),
            _ => None,
        };
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| BuildError::Bind {
                addr: listen,
                source,
            })?;
        let source_budget = open_source_budget(&config, redis.as_ref(), &metrics)?;
        let (bot_shield, order_spends) = open_bot_shield(
            &config,
            waiting_room.as_ref(),
            redis.as_ref(),
            settings.ticket_key.as_deref(),
        )?;
        let clock = Arc::new(SaleClock::default());
        let state = AppState::new(Inner {
            verifier: settings.verifier.with_clock(clock.clone()),
            clock,
            rate: RateLimiter::new(
                redis.clone(),
                config.rate_settings(),
                metrics.rate_limit_charges("user"),
            ),
            limiter: ConcurrencyLimiter::new(config.concurrency_settings()),
            switches: Switchboard::new(),
            bot_shield,
            order_spends,
            source_budget,
            waiting_room,
            inventory,
            producer: Arc::new(OrderProducer::new(&producer)?),
            redis,
            items,
            payments,
            chat: ChatThrottle::default(),
            metrics,
            config,
        });
        Ok(Self {
            state,
            listener,
            switches: settings.switches,
            kube,
        })
    }

    /// The address bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, std::io::Error> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown`, with the switch watch and the background
    /// loop running alongside.
    pub async fn serve(self, shutdown: Shutdown) -> Result<(), std::io::Error> {
        let state = self.state;
        // Before the first answer: challenges issued at once take their
        // expiry from Redis's clock, not from this replica's.
        sync_clock(&state).await;
        let stop = shutdown.clone();
        let board = state.switches.clone();
        let watch = async move {
            match (self.switches, self.kube) {
                (SwitchSource::File(path), _) => {
                    degradation::watch_file(path, board, stop.wait()).await
                }
                (SwitchSource::ConfigMap { namespace, name }, Some(client)) => {
                    degradation::watch_config_map(client, namespace, name, board, stop.wait()).await
                }
                _ => {}
            }
        };
        let background = background(state.clone(), shutdown.clone());
        if let Ok(addr) = self.listener.local_addr() {
            tracing::info!(%addr, sale = state.config.sale, "public API listening");
        }
        // The peer's address, for the bot shield's per-source budget.
        let serve = axum::serve(
            self.listener,
            app::router(state.clone()).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { shutdown.wait().await });
        let (served, (), ()) = tokio::join!(serve, watch, background);
        served
    }
}

/// Measures the offset to Redis's clock and exports the replica's skew;
/// keeps the last offset while Redis does not answer.
async fn sync_clock(state: &AppState) {
    let Some(redis) = &state.redis else { return };
    match state.clock.sync(redis).await {
        Ok(skew) => state.metrics.set_clock_skew(skew),
        Err(err) => tracing::debug!(error = %err, "clock: Redis's TIME not read"),
    }
}

/// Every second: measure the clock's offset to Redis's. Every tick: move
/// the admission frontier (any replica may; the script
/// makes it exact), refresh the gauges, prune idle local limiter state; on
/// every switch change: export tier and generation.
async fn background(state: AppState, shutdown: Shutdown) {
    let mut switches = state.switches.subscribe();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    let current = state.switches.current();
    state
        .metrics
        .set_degradation(current.tier, current.generation);
    loop {
        tokio::select! {
            () = shutdown.wait() => return,
            changed = switches.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = switches.borrow_and_update().clone();
                tracing::info!(tier = now.tier, generation = now.generation, reason = now.reason, "degradation switches applied");
                state.metrics.set_degradation(now.tier, now.generation);
            }
            _ = ticker.tick() => {
                ticks += 1;
                let waiting = match &state.waiting_room {
                    Some(room) => match room.advance().await {
                        Ok(depth) => Some(depth.issued.saturating_sub(depth.admitted)),
                        Err(err) => {
                            tracing::debug!(error = %err, "waiting room: frontier not advanced");
                            None
                        }
                    },
                    None => None,
                };
                state.metrics.set_levels(state.limiter.limit(), waiting);
                if ticks.is_multiple_of(10) {
                    sync_clock(&state).await;
                }
                if ticks.is_multiple_of(100) {
                    state.rate.prune_local();
                    if let Some(budget) = &state.source_budget {
                        budget.prune_local();
                    }
                    state.chat.prune();
                }
            }
        }
    }
}
