//! A Service reached from outside the cluster through the apiserver alone,
//! as `kubectl port-forward` does, so a run needs only a kubeconfig: no
//! route to pod or cluster IPs (kind on a CI runner has none).
//!
//! Unlike `kubectl port-forward svc/…`, which picks one pod once, every new
//! connection goes to a ready endpoint of the Service at that moment, in
//! turn: a pod a drill kills takes its open connections with it, as behind
//! a real load balancer, and the next connections go to the pods left.
//!
//! The Service's EndpointSlices are watched, so picking an endpoint for a
//! new connection asks the apiserver nothing; the forward itself costs a
//! WebSocket to the apiserver per connection (`docs/benchmarks.md`).
//!
//! The kubeconfig's user needs `create` on `pods/portforward` and `list`
//! and `watch` on `endpointslices` in the Service's namespace.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio::{io::copy_bidirectional, net::TcpListener, task::JoinHandle};

/// Why a forward could not start.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The Service could not be read.
    #[error("reading Service {service}: {source}")]
    Service {
        /// `namespace/name`.
        service: String,
        /// What the apiserver said.
        source: kube::Error,
    },
    /// The Service has no such port.
    #[error("Service {service} has no port {port}")]
    NoPort {
        /// `namespace/name`.
        service: String,
        /// The port asked for.
        port: u16,
    },
    /// No local port could be had.
    #[error("listening on a local port: {0}")]
    Listen(#[from] std::io::Error),
    /// The Service's EndpointSlices could not be watched.
    #[error("watching the EndpointSlices of Service {0}")]
    Watch(String),
}

/// A local port forwarding to a Service's ready pods until dropped.
pub struct Forward {
    address: SocketAddr,
    stats: Arc<Stats>,
    task: JoinHandle<()>,
    /// Keeps the endpoint cache current.
    watch: JoinHandle<()>,
}

/// What a forward did.
#[derive(Debug, Default)]
struct Stats {
    /// Connections forwarded, by pod.
    forwarded: Mutex<BTreeMap<String, u64>>,
    refused: AtomicU64,
}

/// Where one Service port leads.
struct Target {
    pods: Api<Pod>,
    /// The Service's EndpointSlices, as last watched.
    slices: reflector::Store<EndpointSlice>,
    /// The Service port's name, which its EndpointSlices repeat with the
    /// pods' own port number.
    port_name: Option<String>,
    /// The target port when it is a number, for slices that carry none.
    target_port: Option<u16>,
    next: AtomicUsize,
}

impl Forward {
    /// Forwards a free local port on 127.0.0.1 to port `port` of Service
    /// `service` in `ns`.
    pub async fn to_service(
        client: &Client,
        ns: &str,
        service: &str,
        port: u16,
    ) -> Result<Self, ForwardError> {
        Self::to_service_from(client, ns, service, port, 0).await
    }

    /// Forwards local port `local` on 127.0.0.1 (0: any free one) to port
    /// `port` of Service `service` in `ns`.
    pub async fn to_service_from(
        client: &Client,
        ns: &str,
        service: &str,
        port: u16,
        local: u16,
    ) -> Result<Self, ForwardError> {
        let named = format!("{ns}/{service}");
        let found = Api::<Service>::namespaced(client.clone(), ns)
            .get(service)
            .await
            .map_err(|source| ForwardError::Service {
                service: named.clone(),
                source,
            })?;
        let spec_port = found
            .spec
            .and_then(|s| s.ports)
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.port == i32::from(port))
            .ok_or_else(|| ForwardError::NoPort {
                service: named.clone(),
                port,
            })?;
        let target_port = match spec_port.target_port {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                u16::try_from(n).ok()
            }
            Some(_) => None,
            None => Some(port),
        };
        let (slices, writer) = reflector::store();
        let config =
            watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
        let stream = watcher::watcher(Api::<EndpointSlice>::namespaced(client.clone(), ns), config)
            .default_backoff()
            .reflect(writer)
            .applied_objects();
        let watch = tokio::spawn(stream.for_each(|_| std::future::ready(())));
        if tokio::time::timeout(WATCH_START, slices.wait_until_ready())
            .await
            .map_or(true, |ready| ready.is_err())
        {
            watch.abort();
            return Err(ForwardError::Watch(named));
        }
        let target = Arc::new(Target {
            pods: Api::namespaced(client.clone(), ns),
            slices,
            port_name: spec_port.name,
            target_port,
            next: AtomicUsize::new(0),
        });
        let listener = match TcpListener::bind(("127.0.0.1", local)).await {
            Ok(listener) => listener,
            Err(err) => {
                watch.abort();
                return Err(err.into());
            }
        };
        let address = listener.local_addr()?;
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn(serve(listener, target, stats.clone()));
        Ok(Self {
            address,
            stats,
            task,
            watch,
        })
    }

    /// The local address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://<local address>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Connections forwarded so far, by pod.
    pub fn forwarded(&self) -> BTreeMap<String, u64> {
        self.stats
            .forwarded
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default()
    }

    /// Connections closed at once because no ready pod took them.
    pub fn refused(&self) -> u64 {
        self.stats.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
        self.watch.abort();
    }
}

/// How long the first list of the Service's EndpointSlices may take.
const WATCH_START: std::time::Duration = std::time::Duration::from_secs(30);

/// The pause after a failed accept.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

async fn serve(listener: TcpListener, target: Arc<Target>, stats: Arc<Stats>) {
    loop {
        let Ok((mut local, _)) = listener.accept().await else {
            // Out of file descriptors, most likely: let connections close
            // rather than spin.
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            continue;
        };
        let (target, stats) = (target.clone(), stats.clone());
        tokio::spawn(async move {
            match target.open().await {
                Some((pod, mut remote)) => {
                    if let Ok(mut forwarded) = stats.forwarded.lock() {
                        *forwarded.entry(pod).or_default() += 1;
                    }
                    // Either side closing or failing ends the connection,
                    // as a reset would.
                    let _ = copy_bidirectional(&mut local, &mut remote).await;
                }
                None => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}

impl Target {
    /// A stream to the next ready endpoint that accepts one, trying each
    /// ready endpoint at most once, with the pod it leads to.
    async fn open(&self) -> Option<(String, tokio::io::DuplexStream)> {
        let ready = self.ready();
        if ready.is_empty() {
            return None;
        }
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..ready.len() {
            let (pod, port) = &ready[(first + i) % ready.len()];
            let Ok(mut forwarder) = self.pods.portforward(pod, &[*port]).await else {
                continue;
            };
            if let Some(stream) = forwarder.take_stream(*port) {
                // The forwarder's task ends with the stream; it needs no
                // handle kept.
                tokio::spawn(forwarder.join());
                return Some((pod.clone(), stream));
            }
        }
        None
    }

    /// The Service's ready endpoints as last watched: (pod, port), in a
    /// stable order.
    fn ready(&self) -> Vec<(String, u16)> {
        let mut ready = Vec::new();
        for slice in self.slices.state() {
            let port = slice
                .ports
                .as_ref()
                .and_then(|ports| ports.iter().find(|p| p.name == self.port_name))
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
                .or(self.target_port);
            let Some(port) = port else { continue };
            for endpoint in slice.endpoints.iter().flatten() {
                let is_ready = endpoint
                    .conditions
                    .as_ref()
                    .and_then(|c| c.ready)
                    .unwrap_or(true);
                let pod = endpoint
                    .target_ref
                    .as_ref()
                    .filter(|r| r.kind.as_deref() == Some("Pod"))
                    .and_then(|r| r.name.clone());
                if let (true, Some(pod)) = (is_ready, pod) {
                    ready.push((pod, port));
                }
            }
        }
        ready.sort();
        ready
    }
}
