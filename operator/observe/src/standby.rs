//! Reads what a standby region's readiness needs besides Prometheus: how far
//! a Redis primary's replicas are behind (`INFO replication`), and how the
//! global endpoint sees its servers (HAProxy's CSV statistics). Each read is
//! bounded by its timeout and fails with a sentence, never a panic.

use std::{sync::OnceLock, time::Duration};

use flashsale_runtime::REGION_HEADER;

/// Why a standby figure could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StandbyReadError {
    /// The source did not answer in time.
    #[error("{what} did not answer within {}", flashsale_api::Duration(*.timeout))]
    Timeout {
        /// What was asked.
        what: String,
        /// The bound.
        timeout: Duration,
    },
    /// The source answered with an error, or could not be reached.
    #[error("{what}: {detail}")]
    Failed {
        /// What was asked.
        what: String,
        /// Why, with every cause.
        detail: String,
    },
    /// The answer does not hold what was asked.
    #[error("{what}: {detail}")]
    Answer {
        /// What was asked.
        what: String,
        /// What is missing.
        detail: String,
    },
}

/// A Redis primary's replicas as `INFO replication` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaLags {
    /// Replicas in state `online`.
    pub online: usize,
    /// The slowest online replica's lag: seconds since its last
    /// acknowledgement (Redis counts whole seconds; replicas acknowledge
    /// every second).
    pub worst_lag_secs: Option<u64>,
    /// The slowest online replica's distance in bytes from the primary's
    /// replication offset.
    pub worst_behind_bytes: Option<u64>,
}

/// Reads the replicas of the Redis primary at `url`.
///
/// # Errors
/// The URL is unusable, Redis did not answer within `timeout`, or the
/// server is not a primary.
pub async fn redis_replicas(url: &str, timeout: Duration) -> Result<ReplicaLags, StandbyReadError> {
    let info = replication_info(url, timeout).await?;
    parse_replication(&info).map_err(|detail| StandbyReadError::Answer {
        what: format!("Redis {}", shown(url)),
        detail,
    })
}

/// Has the Redis at `url` follow `primary` (`host:port`), or, with `None`,
/// promotes it (`REPLICAOF NO ONE`).
///
/// # Errors
/// The URL or `primary` is unusable, or Redis did not accept it within
/// `timeout`.
pub async fn redis_replicaof(
    url: &str,
    primary: Option<&str>,
    timeout: Duration,
) -> Result<(), StandbyReadError> {
    let mut cmd = redis::cmd("REPLICAOF");
    match primary {
        None => cmd.arg("NO").arg("ONE"),
        Some(primary) => {
            let (host, port) = host_port(url, primary)?;
            cmd.arg(host).arg(port)
        }
    };
    redis_call::<String>(url, timeout, &cmd).await.map(drop)
}

/// `address` (`host:port`) of another server, as told to the Redis at
/// `url`, split.
fn host_port<'a>(url: &str, address: &'a str) -> Result<(&'a str, &'a str), StandbyReadError> {
    address
        .rsplit_once(':')
        .ok_or_else(|| StandbyReadError::Answer {
            what: format!("Redis {}", shown(url)),
            detail: format!("`{address}` is not host:port"),
        })
}

/// The units of SKU `sku` of sale `sale` the inventory has given out
/// (reserved or sold) in the Redis at `url`: the sum of its shards'
/// `held` counters (`flashsale_inventory_api::keys`); 0 for a SKU the
/// Redis has no record of.
///
/// # Errors
/// The URL is unusable, Redis did not answer within `timeout`, or a
/// counter is not a number.
pub async fn redis_held_units(
    url: &str,
    (sale, sku): (&str, &str),
    timeout: Duration,
) -> Result<u64, StandbyReadError> {
    let keys = flashsale_inventory_api::keys::SaleKeys::new(sale);
    let shards: Option<u32> = redis_call(
        url,
        timeout,
        redis::cmd("HGET").arg(keys.sku(sku)).arg("shards"),
    )
    .await?;
    let Some(shards) = shards.map(|n| n.max(1)) else {
        return Ok(0);
    };
    let mut held = 0u64;
    for index in 0..shards {
        let key = keys.shard(sku, shards, index).held();
        let units: Option<u64> = redis_call(url, timeout, redis::cmd("GET").arg(key)).await?;
        held = held.saturating_add(units.unwrap_or(0));
    }
    Ok(held)
}

/// A Redis server's place in replication, from `INFO replication`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisRole {
    /// It takes writes; its replication offset.
    Primary {
        /// `master_repl_offset`.
        offset: u64,
    },
    /// It follows `of` (`host:port`).
    Replica {
        /// The primary it follows.
        of: String,
        /// Whether its link to that primary is up.
        linked: bool,
        /// How far it has applied the primary's stream
        /// (`slave_repl_offset`).
        offset: u64,
    },
}

/// Reads the role of the Redis at `url`.
///
/// # Errors
/// The URL is unusable, Redis did not answer within `timeout`, or the
/// answer names no role.
pub async fn redis_role(url: &str, timeout: Duration) -> Result<RedisRole, StandbyReadError> {
    let info = replication_info(url, timeout).await?;
    role(&info).map_err(|detail| StandbyReadError::Answer {
        what: format!("Redis {}", shown(url)),
        detail,
    })
}

/// Has the Redis primary at `url` hand its role to its replica `to`
/// (`host:port`) with Redis's own coordinated failover (`FAILOVER TO …
/// TIMEOUT …`): it holds its clients' writes, waits until `to` has applied
/// everything it wrote, then follows `to`, which takes writes. Redis gives
/// up (and takes writes again) when `to` has not caught up within
/// `within`. Returns once Redis accepted the request; [`redis_role`] tells
/// how it went.
///
/// # Errors
/// The URL or `to` is unusable, or Redis refused (not a primary, `to` not
/// one of its replicas, a failover already under way).
pub async fn redis_hand_over(
    url: &str,
    to: &str,
    (within, timeout): (Duration, Duration),
) -> Result<(), StandbyReadError> {
    let (host, port) = host_port(url, to)?;
    let mut cmd = redis::cmd("FAILOVER");
    cmd.arg("TO")
        .arg(host)
        .arg(port)
        .arg("TIMEOUT")
        .arg(u64::try_from(within.as_millis()).unwrap_or(u64::MAX));
    redis_call::<String>(url, timeout, &cmd).await.map(drop)
}

/// The `host:port` other servers reach the Redis at `url` by, as the URL
/// names it (6379 when it names no port).
///
/// # Errors
/// The URL names no host.
pub fn redis_address(url: &str) -> Result<String, StandbyReadError> {
    let parsed = reqwest::Url::parse(url).map_err(|err| StandbyReadError::Answer {
        what: format!("Redis {}", shown(url)),
        detail: err.to_string(),
    })?;
    match parsed.host_str() {
        Some(host) => Ok(format!("{host}:{}", parsed.port().unwrap_or(6379))),
        None => Err(StandbyReadError::Answer {
            what: format!("Redis {}", shown(url)),
            detail: "the URL names no host".to_owned(),
        }),
    }
}

/// Of the orders `order_ids` of sale `sale`, those whose reservation the
/// inventory's records in the Redis at `url` do not hold (an order is named
/// after its reservation): units that stock would give out again. An id
/// that names no reservation counts as not held.
///
/// # Errors
/// The URL is unusable, or Redis did not answer within `timeout`.
pub async fn redis_unreserved_orders(
    url: &str,
    sale: &str,
    order_ids: &[String],
    timeout: Duration,
) -> Result<Vec<String>, StandbyReadError> {
    let keys = flashsale_inventory_api::keys::SaleKeys::new(sale);
    let named: Vec<(&String, String)> = order_ids
        .iter()
        .filter_map(|id| {
            flashsale_inventory_api::reservation_id(id).map(|r| (id, keys.reservation(r)))
        })
        .collect();
    let mut pipe = redis::pipe();
    for (_, key) in &named {
        pipe.cmd("EXISTS").arg(key);
    }
    let held: Vec<bool> = if named.is_empty() {
        Vec::new()
    } else {
        redis_pipe(url, timeout, &pipe).await?
    };
    let held: std::collections::BTreeSet<&String> = named
        .iter()
        .zip(held)
        .filter_map(|((id, _), held)| held.then_some(*id))
        .collect();
    Ok(order_ids
        .iter()
        .filter(|id| !held.contains(id))
        .cloned()
        .collect())
}

/// `INFO replication` of the Redis at `url`.
async fn replication_info(url: &str, timeout: Duration) -> Result<String, StandbyReadError> {
    redis_call(url, timeout, redis::cmd("INFO").arg("replication")).await
}

/// `cmd`'s answer from the Redis at `url`, within `timeout`.
async fn redis_call<T: redis::FromRedisValue>(
    url: &str,
    timeout: Duration,
    cmd: &redis::Cmd,
) -> Result<T, StandbyReadError> {
    let what = format!("Redis {}", shown(url));
    bounded(&what, timeout, async {
        let mut conn = redis_connect(url, &what).await?;
        cmd.query_async(&mut conn)
            .await
            .map_err(|err| redis_failed(&what, &err))
    })
    .await
}

/// `pipe`'s answers from the Redis at `url`, within `timeout`.
async fn redis_pipe<T: redis::FromRedisValue>(
    url: &str,
    timeout: Duration,
    pipe: &redis::Pipeline,
) -> Result<T, StandbyReadError> {
    let what = format!("Redis {}", shown(url));
    bounded(&what, timeout, async {
        let mut conn = redis_connect(url, &what).await?;
        pipe.query_async(&mut conn)
            .await
            .map_err(|err| redis_failed(&what, &err))
    })
    .await
}

/// A fresh connection to the Redis at `url`, known as `what`.
async fn redis_connect(
    url: &str,
    what: &str,
) -> Result<redis::aio::MultiplexedConnection, StandbyReadError> {
    let client = redis::Client::open(url).map_err(|err| redis_failed(what, &err))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|err| redis_failed(what, &err))
}

fn redis_failed(what: &str, err: &redis::RedisError) -> StandbyReadError {
    StandbyReadError::Failed {
        what: what.to_owned(),
        detail: err.to_string(),
    }
}

/// `url` as it may be shown in a status or an Event: scheme, host and port
/// only, since a URL may carry a password (in its user part or its query).
fn shown(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) => match (parsed.host_str(), parsed.port()) {
            (Some(host), Some(port)) => format!("{}://{host}:{port}", parsed.scheme()),
            (Some(host), None) => format!("{}://{host}", parsed.scheme()),
            (None, _) => format!("{}://…", parsed.scheme()),
        },
        Err(_) => "(an unparsable URL, not shown)".to_owned(),
    }
}

/// `ask`, given up after `timeout`.
async fn bounded<T>(
    what: &str,
    timeout: Duration,
    ask: impl Future<Output = Result<T, StandbyReadError>>,
) -> Result<T, StandbyReadError> {
    tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| StandbyReadError::Timeout {
            what: what.to_owned(),
            timeout,
        })?
}

/// The `name:value` lines of an `INFO` answer.
fn info_fields(info: &str) -> Vec<(&str, &str)> {
    info.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .collect()
}

/// The primary a replica's `INFO replication` names, `host:port`.
fn followed(info: &str) -> Result<String, String> {
    let fields = info_fields(info);
    let field = |name: &str| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    match (field("role"), field("master_host"), field("master_port")) {
        (Some("slave"), Some(host), Some(port)) => Ok(format!("{host}:{port}")),
        (Some("slave"), ..) => Err("it is a replica that names no primary".to_owned()),
        (Some(role), ..) => Err(format!("it is a {role}, not a replica")),
        (None, ..) => Err("no role in INFO replication".to_owned()),
    }
}

/// The role an `INFO replication` answer gives.
fn role(info: &str) -> Result<RedisRole, String> {
    let fields = info_fields(info);
    let field = |name: &str| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let offset = |name: &str| field(name).and_then(|v| v.parse().ok()).unwrap_or(0);
    match field("role") {
        Some("master") => Ok(RedisRole::Primary {
            offset: offset("master_repl_offset"),
        }),
        Some("slave") => Ok(RedisRole::Replica {
            of: followed(info)?,
            linked: field("master_link_status") == Some("up"),
            offset: offset("slave_repl_offset"),
        }),
        Some(role) => Err(format!("it has the role {role}")),
        None => Err("no role in INFO replication".to_owned()),
    }
}

/// The replicas in an `INFO replication` answer.
fn parse_replication(info: &str) -> Result<ReplicaLags, String> {
    let fields = info_fields(info);
    let field = |name: &str| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    match field("role") {
        Some("master") => {}
        Some(role) => return Err(format!("it is a {role}, not the primary")),
        None => return Err("no role in INFO replication".to_owned()),
    }
    let primary_offset: Option<u64> = field("master_repl_offset").and_then(|v| v.parse().ok());
    let mut lags = ReplicaLags {
        online: 0,
        worst_lag_secs: None,
        worst_behind_bytes: None,
    };
    // slave<N>:ip=…,port=…,state=online,offset=…,lag=…
    for (key, value) in &fields {
        if key
            .strip_prefix("slave")
            .is_none_or(|n| n.parse::<u32>().is_err())
        {
            continue;
        }
        let attrs: Vec<(&str, &str)> = value.split(',').filter_map(|a| a.split_once('=')).collect();
        let attr = |name: &str| attrs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        if attr("state") != Some("online") {
            continue;
        }
        lags.online += 1;
        let lag: Option<u64> = attr("lag").and_then(|v| v.parse().ok());
        let offset: Option<u64> = attr("offset").and_then(|v| v.parse().ok());
        lags.worst_lag_secs = lags.worst_lag_secs.max(lag);
        if let (Some(primary), Some(offset)) = (primary_offset, offset) {
            let behind = primary.saturating_sub(offset);
            lags.worst_behind_bytes = lags.worst_behind_bytes.max(Some(behind));
        }
    }
    Ok(lags)
}

/// One server of an HAProxy backend, as its CSV statistics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaproxyServer {
    /// The backend (`pxname`).
    pub backend: String,
    /// The server (`svname`).
    pub name: String,
    /// The `status` column: `UP`, `DOWN`, a transition (`UP 1/2`), `NOLB`,
    /// `MAINT`, …
    pub status: String,
    /// Requests it was given since HAProxy started (`stot`).
    pub served: u64,
}

impl HaproxyServer {
    /// Whether HAProxy would send it traffic: `UP`, including a server
    /// going down that has not failed enough checks yet (`UP 1/2`).
    pub fn up(&self) -> bool {
        self.status == "UP" || self.status.starts_with("UP ")
    }
}

/// Every server of every backend in HAProxy's CSV statistics at `url`.
///
/// # Errors
/// The statistics could not be fetched within `timeout`, or lack a column.
pub async fn haproxy_servers(
    url: &str,
    timeout: Duration,
) -> Result<Vec<HaproxyServer>, StandbyReadError> {
    let what = format!("HAProxy statistics {}", shown(url));
    let failed = |err: reqwest::Error| StandbyReadError::Failed {
        what: what.clone(),
        detail: crate::probe::causes(&err.without_url()),
    };
    let ask = async {
        http()
            .map_err(failed)?
            .get(url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(failed)?
            .text()
            .await
            .map_err(failed)
    };
    let csv = bounded(&what, timeout, ask).await?;
    parse_haproxy(&csv).map_err(|detail| StandbyReadError::Answer { what, detail })
}

/// `backend/server` in HAProxy's CSV statistics at `url`.
///
/// # Errors
/// As [`haproxy_servers`], or the statistics do not list the server.
pub async fn haproxy_server(
    url: &str,
    server: &str,
    timeout: Duration,
) -> Result<HaproxyServer, StandbyReadError> {
    let answer = |detail: String| StandbyReadError::Answer {
        what: format!("HAProxy statistics {}", shown(url)),
        detail,
    };
    let (backend, name) = server
        .split_once('/')
        .ok_or_else(|| answer(format!("{server:?} is not backend/server")))?;
    haproxy_servers(url, timeout)
        .await?
        .into_iter()
        .find(|s| s.backend == backend && s.name == name)
        .ok_or_else(|| answer(format!("no server {name} in backend {backend}")))
}

/// Which region answers a request to `base_url`'s `path` (a global
/// endpoint, or one region's gateway): the answer's status and its
/// [`REGION_HEADER`], `None` when the answer carries none (it came from
/// something other than a gateway, HAProxy's own 503 for one).
///
/// # Errors
/// Nothing answered within `timeout`.
pub async fn answering_region(
    base_url: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Option<String>), StandbyReadError> {
    ask(
        base_url,
        path,
        timeout,
        |http, url| http.get(url),
        async |a| (a.status().as_u16(), region(&a)),
    )
    .await
}

/// A gateway's answer to an order, as [`place_order`] read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The region the answer was stamped with; `None` when no gateway gave it.
    pub region: Option<String>,
    /// The `orderId` of an acknowledged order.
    pub order_id: Option<String>,
}

/// Orders one unit of `sku` through `base_url` (a global endpoint, or one
/// region's gateway) as the bearer of `token`, with `idempotency_key`.
///
/// # Errors
/// Nothing answered within `timeout`.
pub async fn place_order(
    base_url: &str,
    (token, sku, idempotency_key): (&str, &str, &str),
    timeout: Duration,
) -> Result<OrderAnswer, StandbyReadError> {
    let body = serde_json::json!({"sku": sku, "quantity": 1, "idempotencyKey": idempotency_key});
    let build = |http: reqwest::Client, url| http.post(url).bearer_auth(token).json(&body);
    ask(base_url, "/api/v1/orders", timeout, build, async |answer| {
        let (status, region) = (answer.status().as_u16(), region(&answer));
        let body: serde_json::Value = answer.json().await.unwrap_or_default();
        OrderAnswer {
            status,
            region,
            order_id: body["orderId"].as_str().map(str::to_owned),
        }
    })
    .await
}

/// Sends the request `build` makes for `base_url`'s `path` and reads its
/// answer with `read`, all within `timeout`.
async fn ask<T>(
    base_url: &str,
    path: &str,
    timeout: Duration,
    build: impl FnOnce(reqwest::Client, String) -> reqwest::RequestBuilder,
    read: impl AsyncFnOnce(reqwest::Response) -> T,
) -> Result<T, StandbyReadError> {
    let what = format!("{}{path}", shown(base_url));
    let failed = |err: reqwest::Error| StandbyReadError::Failed {
        what: what.clone(),
        detail: crate::probe::causes(&err.without_url()),
    };
    let asked = async {
        let url = format!("{}{path}", base_url.trim_end_matches('/'));
        let answer = build(http().map_err(failed)?, url)
            .send()
            .await
            .map_err(failed)?;
        Ok(read(answer).await)
    };
    bounded(&what, timeout, asked).await
}

/// The region an answer is stamped with ([`REGION_HEADER`]).
fn region(answer: &reqwest::Response) -> Option<String> {
    answer
        .headers()
        .get(REGION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// One connection pool for every endpoint read.
fn http() -> Result<reqwest::Client, reqwest::Error> {
    static HTTP: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(http) = HTTP.get() {
        return Ok(http.clone());
    }
    let http = reqwest::Client::builder().build()?;
    Ok(HTTP.get_or_init(|| http).clone())
}

/// The servers in HAProxy's CSV statistics (header `# pxname,svname,…`);
/// a proxy's own `FRONTEND` and `BACKEND` rows are not servers.
fn parse_haproxy(csv: &str) -> Result<Vec<HaproxyServer>, String> {
    let mut lines = csv.lines();
    let header = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .ok_or("no header line")?;
    let columns: Vec<&str> = header.split(',').collect();
    let column = |name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .ok_or_else(|| format!("no {name} column"))
    };
    let (px, sv) = (column("pxname")?, column("svname")?);
    let (status, total) = (column("status")?, column("stot")?);
    Ok(lines
        .map(|line| line.split(',').collect::<Vec<&str>>())
        .filter(|row| !matches!(row.get(sv), Some(&"FRONTEND" | &"BACKEND") | None))
        .map(|row| {
            let field = |i: usize| row.get(i).copied().unwrap_or_default().to_owned();
            HaproxyServer {
                backend: field(px),
                name: field(sv),
                status: field(status),
                served: field(total).parse().unwrap_or(0),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_online_replica_counts_and_others_are_left_out() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=127.0.0.1,port=16382,state=online,offset=1000,lag=0\r\n\
            slave1:ip=127.0.0.1,port=16383,state=online,offset=400,lag=3\r\n\
            slave2:ip=127.0.0.1,port=16384,state=wait_bgsave,offset=0,lag=9\r\n\
            master_repl_offset:1200\r\n";
        assert_eq!(
            parse_replication(info),
            Ok(ReplicaLags {
                online: 2,
                worst_lag_secs: Some(3),
                worst_behind_bytes: Some(800),
            })
        );
    }

    #[test]
    fn a_primary_without_replicas_and_a_replica_are_told_apart() {
        let alone =
            parse_replication("role:master\r\nconnected_slaves:0\r\nmaster_repl_offset:5\r\n");
        assert_eq!(alone.map(|l| (l.online, l.worst_lag_secs)), Ok((0, None)));
        let replica = parse_replication("role:slave\r\nmaster_host:127.0.0.1\r\n");
        assert_eq!(replica, Err("it is a slave, not the primary".to_owned()));
    }

    #[test]
    fn a_replica_names_the_primary_it_follows() {
        let replica = "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.7\r\n\
            master_port:6379\r\nmaster_link_status:up\r\n";
        assert_eq!(followed(replica), Ok("10.0.0.7:6379".to_owned()));
        assert_eq!(
            followed("role:master\r\nconnected_slaves:0\r\n"),
            Err("it is a master, not a replica".to_owned())
        );
        assert_eq!(
            followed("role:slave\r\n"),
            Err("it is a replica that names no primary".to_owned())
        );
    }

    #[test]
    fn a_role_tells_a_primary_from_a_replica_with_their_offsets() {
        assert_eq!(
            role("role:master\r\nconnected_slaves:1\r\nmaster_repl_offset:420\r\n"),
            Ok(RedisRole::Primary { offset: 420 })
        );
        let syncing = "role:slave\r\nmaster_host:10.0.0.7\r\nmaster_port:6379\r\n\
            master_link_status:down\r\nslave_repl_offset:17\r\n";
        assert_eq!(
            role(syncing),
            Ok(RedisRole::Replica {
                of: "10.0.0.7:6379".to_owned(),
                linked: false,
                offset: 17
            })
        );
        assert!(role("# Replication\r\n").is_err());
    }

    #[test]
    fn a_redis_address_is_the_urls_host_and_port() -> Result<(), StandbyReadError> {
        assert_eq!(
            redis_address("redis://u:p@10.0.0.7:16382/0")?,
            "10.0.0.7:16382"
        );
        assert_eq!(redis_address("redis://redis-b")?, "redis-b:6379");
        assert!(redis_address("not a url").is_err());
        Ok(())
    }

    #[test]
    fn a_url_is_shown_without_its_credentials() {
        assert_eq!(
            shown("redis://flashsale:s3cret@10.0.0.7:6379/0"),
            "redis://10.0.0.7:6379"
        );
        assert_eq!(
            shown("redis+unix:///run/redis.sock?pass=s3cret"),
            "redis+unix://…"
        );
        assert_eq!(shown("http://admin:pw@edge:8404/;csv"), "http://edge:8404");
        assert_eq!(shown("https://edge/stats;csv"), "https://edge");
        assert!(!shown("not a url s3cret").contains("s3cret"));
    }

    #[test]
    fn servers_are_read_by_backend_and_up_means_taking_traffic() {
        let csv = "# pxname,svname,qcur,stot,status,weight\n\
            sale,FRONTEND,,12,OPEN,\n\
            sale,region-a,0,9,UP,1\n\
            sale,region-b,0,3,UP 1/2,1\n\
            sale,BACKEND,0,12,UP,\n\
            other,region-b,0,0,DOWN,1\n";
        let servers = parse_haproxy(csv).unwrap_or_default();
        let named: Vec<(&str, &str, bool, u64)> = servers
            .iter()
            .map(|s| (s.backend.as_str(), s.name.as_str(), s.up(), s.served))
            .collect();
        assert_eq!(
            named,
            [
                ("sale", "region-a", true, 9),
                ("sale", "region-b", true, 3),
                ("other", "region-b", false, 0)
            ]
        );
        assert_eq!(
            parse_haproxy("# pxname,svname\n"),
            Err("no status column".to_owned())
        );
        assert!(parse_haproxy("pxname,svname\n").is_err());
    }
}
