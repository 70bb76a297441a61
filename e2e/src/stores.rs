//! Where a cluster's stores and Prometheus are, read from the cluster
//! itself, so a run needs nothing but a kubeconfig.
//!
//! The Secret `stores` in namespace `flashsale-stack` names them as the
//! sale's pods reach them (keys `redis-url`, `database-url`,
//! `kafka-brokers`, `prometheus-url`), by the cluster DNS names of their
//! Services. The local stack writes it for its host processes; a kind
//! cluster's install writes it for the stores it runs as pods. A run
//! outside the cluster reaches each of those Services by its [`Reach`].
//!
//! Kafka clients connect to the addresses the brokers advertise, not to
//! the one they bootstrapped from, so a forwarded bootstrap address alone
//! leads nowhere. The optional key `kafka-outside` names a listener of the
//! brokers' Service for clients outside the cluster that advertises
//! `127.0.0.1` and its own port: through the apiserver, the run forwards
//! that same local port to it, as `kubectl port-forward svc/kafka
//! 29092:29092` would.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::{
    forward::Forward,
    reach::{Reach, ReachError},
};

/// The namespace of the stores' Services and of the Secret naming them.
pub const NAMESPACE: &str = "flashsale-stack";
/// The Secret naming the stores.
pub const SECRET: &str = "stores";

/// Why the stores could not be found or reached.
#[derive(Debug, thiserror::Error)]
pub enum StoresError {
    /// The Secret could not be read.
    #[error(
        "reading Secret {namespace}/{SECRET}, which names the cluster's stores: {source}. \
         The local stack writes it (`e2e/local/stack up`); on another cluster, create it \
         with the keys redis-url, database-url, kafka-brokers and prometheus-url"
    )]
    Secret {
        /// The Secret's namespace.
        namespace: String,
        /// Why.
        source: kube::Error,
    },
    /// A key is missing or not text.
    #[error("Secret {namespace}/{SECRET} has no text key {key}")]
    Key {
        /// The Secret's namespace.
        namespace: String,
        /// The key.
        key: &'static str,
    },
    /// An address has no port, or one that is not a number.
    #[error("{key}: `{address}` names no port")]
    Port {
        /// The Secret's key.
        key: &'static str,
        /// The address in it.
        address: String,
    },
    /// An address that must be a Service's is not.
    #[error("{key}: `{address}` is not <service>.<namespace>.svc:<port>")]
    NotService {
        /// The Secret's key.
        key: &'static str,
        /// The address in it.
        address: String,
    },
    /// A store's Service could not be reached.
    #[error("{key}: {source}")]
    Reach {
        /// The Secret's key.
        key: &'static str,
        /// Why.
        source: ReachError,
    },
}

/// The stores' and Prometheus's addresses, from one side of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Urls {
    /// `redis://` URL of Redis.
    pub redis: String,
    /// `postgres://` URL of the order database.
    pub database: String,
    /// Kafka's bootstrap servers, `host:port[,host:port…]`.
    pub kafka_brokers: String,
    /// Base URL of Prometheus.
    pub prometheus: String,
}

/// The cluster's stores, as its pods reach them and as this run does.
pub struct Stores {
    /// As the sale's pods reach them.
    pub in_cluster: Urls,
    /// As this run reaches them.
    pub here: Urls,
    /// Forwards behind `here`, kept open as long as the stores are.
    _forwards: Vec<Forward>,
}

impl Stores {
    /// Reads the Secret naming the stores and reaches each of them `reach`.
    pub async fn discover(client: &Client, reach: Reach) -> Result<Self, StoresError> {
        Self::discover_in(client, NAMESPACE, reach).await
    }

    /// [`Stores::discover`] from the Secret `stores` of `namespace`.
    pub async fn discover_in(
        client: &Client,
        namespace: &str,
        reach: Reach,
    ) -> Result<Self, StoresError> {
        let secret = Api::<Secret>::namespaced(client.clone(), namespace)
            .get(SECRET)
            .await
            .map_err(|source| StoresError::Secret {
                namespace: namespace.to_owned(),
                source,
            })?;
        let data = secret.data.unwrap_or_default();
        let text = |key: &'static str| {
            data.get(key)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| StoresError::Key {
                    namespace: namespace.to_owned(),
                    key,
                })
        };
        let in_cluster = Urls {
            redis: text("redis-url")?,
            database: text("database-url")?,
            kafka_brokers: text("kafka-brokers")?,
            prometheus: text("prometheus-url")?,
        };
        let mut reacher = Reacher {
            client,
            reach,
            reached: BTreeMap::new(),
            forwards: Vec::new(),
        };
        let here = Urls {
            redis: reacher.url("redis-url", &in_cluster.redis).await?,
            database: reacher.url("database-url", &in_cluster.database).await?,
            kafka_brokers: match (reach, text("kafka-outside").ok()) {
                (Reach::Apiserver, Some(outside)) => {
                    reacher.outside("kafka-outside", &outside).await?
                }
                _ => {
                    reacher
                        .brokers("kafka-brokers", &in_cluster.kafka_brokers)
                        .await?
                }
            },
            prometheus: reacher
                .url("prometheus-url", &in_cluster.prometheus)
                .await?,
        };
        Ok(Self {
            in_cluster,
            here,
            _forwards: reacher.forwards,
        })
    }
}

/// Reaches each Service address once, keeping the forwards.
struct Reacher<'a> {
    client: &'a Client,
    reach: Reach,
    /// In-cluster `host:port` → `host:port` from here.
    reached: BTreeMap<String, String>,
    forwards: Vec<Forward>,
}

impl Reacher<'_> {
    /// `url` with its host and port as reached from here.
    async fn url(&mut self, key: &'static str, url: &str) -> Result<String, StoresError> {
        let (before, authority, after) = split_url(url);
        let (credentials, host_port) = match authority.rsplit_once('@') {
            Some((credentials, host_port)) => (Some(credentials), host_port),
            None => (None, authority),
        };
        let reached = self.address(key, host_port, default_port(before)).await?;
        Ok(match credentials {
            Some(credentials) => format!("{before}{credentials}@{reached}{after}"),
            None => format!("{before}{reached}{after}"),
        })
    }

    /// A comma-separated list of `host:port`, each as reached from here.
    async fn brokers(&mut self, key: &'static str, list: &str) -> Result<String, StoresError> {
        let mut reached = Vec::new();
        for broker in list.split(',').map(str::trim).filter(|b| !b.is_empty()) {
            reached.push(self.address(key, broker, None).await?);
        }
        Ok(reached.join(","))
    }

    /// `127.0.0.1:<port>`, forwarded through the apiserver to the same
    /// port of the Service `host_port` names.
    async fn outside(&mut self, key: &'static str, host_port: &str) -> Result<String, StoresError> {
        let (host, port) = split_port(key, host_port, None)?;
        let (name, ns) = service_of(host).ok_or_else(|| StoresError::NotService {
            key,
            address: host_port.to_owned(),
        })?;
        let reached = Reach::Apiserver
            .service_from(self.client, ns, name, port, port)
            .await
            .map_err(|source| StoresError::Reach { key, source })?;
        self.forwards.extend(reached.forward);
        Ok(reached.address)
    }

    /// `host:port` as reached from here: a Service's cluster DNS name is
    /// reached by the run's [`Reach`]; any other host is taken as it is.
    async fn address(
        &mut self,
        key: &'static str,
        host_port: &str,
        default: Option<u16>,
    ) -> Result<String, StoresError> {
        let (host, port) = split_port(key, host_port, default)?;
        let Some((name, ns)) = service_of(host) else {
            return Ok(format!("{host}:{port}"));
        };
        let known = format!("{host}:{port}");
        if let Some(address) = self.reached.get(&known) {
            return Ok(address.clone());
        }
        let reached = self
            .reach
            .service(self.client, ns, name, port)
            .await
            .map_err(|source| StoresError::Reach { key, source })?;
        self.forwards.extend(reached.forward);
        self.reached.insert(known, reached.address.clone());
        Ok(reached.address)
    }
}

/// `(scheme and "//", authority, path and the rest)` of `url`; a text
/// without a scheme is all authority up to its first `/`.
fn split_url(url: &str) -> (&str, &str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    (&url[..start], &url[start..end], &url[end..])
}

/// `(host, port)` of `host_port` (the Secret's `key`), the port `default`
/// when it names none.
fn split_port<'a>(
    key: &'static str,
    host_port: &'a str,
    default: Option<u16>,
) -> Result<(&'a str, u16), StoresError> {
    let port_error = || StoresError::Port {
        key,
        address: host_port.to_owned(),
    };
    match host_port.rsplit_once(':') {
        Some((host, port)) => Ok((host, port.parse::<u16>().map_err(|_| port_error())?)),
        None => Ok((host_port, default.ok_or_else(port_error)?)),
    }
}

/// The port a URL's scheme implies when it names none.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme.trim_end_matches("://") {
        "redis" => Some(6379),
        "postgres" | "postgresql" => Some(5432),
        "http" => Some(80),
        _ => None,
    }
}

/// `(service, namespace)` when `host` is a Service's cluster DNS name
/// (`<service>.<namespace>.svc[.<cluster domain>]`).
pub fn service_of(host: &str) -> Option<(&str, &str)> {
    let mut labels = host.split('.');
    let (service, ns, svc) = (labels.next()?, labels.next()?, labels.next()?);
    (svc == "svc" && !service.is_empty() && !ns.is_empty()).then_some((service, ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_splits_around_its_authority() {
        assert_eq!(
            split_url("postgres://u:p@postgres.s.svc.cluster.local:5432/db?x=1"),
            (
                "postgres://",
                "u:p@postgres.s.svc.cluster.local:5432",
                "/db?x=1"
            )
        );
        assert_eq!(
            split_url("http://prometheus.s.svc:9090"),
            ("http://", "prometheus.s.svc:9090", "")
        );
        assert_eq!(split_url("kafka.s.svc:9092"), ("", "kafka.s.svc:9092", ""));
    }

    #[test]
    fn only_cluster_service_names_are_services() {
        assert_eq!(
            service_of("redis.flashsale-stack.svc.cluster.local"),
            Some(("redis", "flashsale-stack"))
        );
        assert_eq!(service_of("kafka.shop.svc"), Some(("kafka", "shop")));
        assert_eq!(
            service_of("kafka-0.kafka-headless.shop.svc.cluster.local"),
            None
        );
        assert_eq!(service_of("10.0.0.1"), None);
        assert_eq!(service_of("redis.example.com"), None);
    }

    #[test]
    fn an_address_without_a_port_takes_the_default_or_is_refused() {
        assert!(matches!(
            split_port("redis-url", "redis.s.svc:6380", Some(6379)),
            Ok(("redis.s.svc", 6380))
        ));
        assert!(matches!(
            split_port("redis-url", "redis.s.svc", Some(6379)),
            Ok(("redis.s.svc", 6379))
        ));
        for bad in ["kafka.s.svc", "kafka.s.svc:x"] {
            let err = split_port("kafka-brokers", bad, None).map(|_| ());
            assert!(
                matches!(&err, Err(StoresError::Port { key: "kafka-brokers", address }) if address == bad),
                "{err:?}"
            );
        }
    }

    #[test]
    fn schemes_imply_their_ports() {
        assert_eq!(default_port("redis://"), Some(6379));
        assert_eq!(default_port("postgres://"), Some(5432));
        assert_eq!(default_port(""), None);
    }
}
