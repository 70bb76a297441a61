//! How a run outside the cluster reaches a Service's port: by its cluster
//! IP where the host routes to it (the local stack's node is the host), or
//! through the apiserver alone where only a kubeconfig reaches the cluster
//! (kind on a CI runner).

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{Api, Client, api::ListParams};

use crate::forward::{Forward, ForwardError};

/// How a run outside the cluster reaches Services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Reach {
    /// The Service's cluster IP, which the host routes to.
    #[default]
    ServiceIp,
    /// Through the apiserver, as `kubectl port-forward` does: all a
    /// kubeconfig gives a run outside the cluster. A Service without a
    /// selector (a store outside the cluster) has no pod to forward to and
    /// is reached at its endpoints' own addresses.
    Apiserver,
}

/// Why a Service could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    /// The Service or its endpoints could not be read.
    #[error("reading Service {service}: {source}")]
    Read {
        /// `namespace/name`.
        service: String,
        /// What the apiserver said.
        source: kube::Error,
    },
    /// The Service has no cluster IP or no ready endpoint for the port.
    #[error("Service {service} has no {what} for port {port}")]
    Missing {
        /// `namespace/name`.
        service: String,
        /// What it lacks.
        what: &'static str,
        /// The Service port.
        port: u16,
    },
    /// The forward through the apiserver could not start.
    #[error(transparent)]
    Forward(#[from] ForwardError),
}

/// A Service port as reached from here: `host:port`, and the forward
/// behind it, which must live as long as the address is used.
pub struct Reached {
    /// `host:port` to connect to.
    pub address: String,
    /// The forward through the apiserver, when there is one.
    pub forward: Option<Forward>,
}

impl Reach {
    /// Reaches port `port` of Service `ns/name`.
    pub async fn service(
        self,
        client: &Client,
        ns: &str,
        name: &str,
        port: u16,
    ) -> Result<Reached, ReachError> {
        self.service_from(client, ns, name, port, 0).await
    }

    /// Reaches port `port` of Service `ns/name`; a forward through the
    /// apiserver listens on local port `local` (0: any free one).
    pub async fn service_from(
        self,
        client: &Client,
        ns: &str,
        name: &str,
        port: u16,
        local: u16,
    ) -> Result<Reached, ReachError> {
        let named = format!("{ns}/{name}");
        let read = |source| ReachError::Read {
            service: named.clone(),
            source,
        };
        let missing = |what| ReachError::Missing {
            service: named.clone(),
            what,
            port,
        };
        let service = Api::<Service>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .map_err(read)?;
        let spec = service.spec.unwrap_or_default();
        let selectorless = spec.selector.as_ref().is_none_or(|s| s.is_empty());
        match self {
            Self::ServiceIp => {
                let ip = spec
                    .cluster_ip
                    .filter(|ip| ip != "None")
                    .ok_or_else(|| missing("cluster IP"))?;
                Ok(Reached {
                    address: format!("{ip}:{port}"),
                    forward: None,
                })
            }
            Self::Apiserver if selectorless => {
                let port_name = spec
                    .ports
                    .unwrap_or_default()
                    .into_iter()
                    .find(|p| p.port == i32::from(port))
                    .ok_or_else(|| missing("such port"))?
                    .name;
                let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
                    .list(
                        &ListParams::default()
                            .labels(&format!("kubernetes.io/service-name={name}")),
                    )
                    .await
                    .map_err(read)?;
                let address = slices
                    .items
                    .iter()
                    .find_map(|slice| ready_address(slice, port_name.as_deref()))
                    .ok_or_else(|| missing("ready endpoint"))?;
                Ok(Reached {
                    address,
                    forward: None,
                })
            }
            Self::Apiserver => {
                let forward = Forward::to_service_from(client, ns, name, port, local).await?;
                Ok(Reached {
                    address: forward.address().to_string(),
                    forward: Some(forward),
                })
            }
        }
    }
}

/// `address:port` of the first ready endpoint of `slice` on the port named
/// `port_name`.
fn ready_address(slice: &EndpointSlice, port_name: Option<&str>) -> Option<String> {
    let port = slice
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.name.as_deref() == port_name)?
        .port?;
    let endpoint = slice
        .endpoints
        .iter()
        .flatten()
        .find(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))?;
    Some(format!("{}:{port}", endpoint.addresses.first()?))
}
