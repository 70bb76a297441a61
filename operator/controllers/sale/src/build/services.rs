//! The ClusterIP Services in front of each workload.

use k8s_openapi::{
    api::core::v1::{Service, ServicePort, ServiceSpec},
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::{
    Owner, labels,
    names::{self, Component},
    pod::{HTTP_PORT, HTTP_PORT_NAME, OPS_PORT, OPS_PORT_NAME},
};

/// The gateway answers shoppers on the usual HTTP port.
const GATEWAY_SERVICE_PORT: i32 = 80;

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        // By name, so the container's port number can change alone.
        target_port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

/// The Service `<sale>-<component>`: gateway http 80, inventory http 8080,
/// and ops 9090 on every one (for Prometheus).
pub(super) fn service(owner: &Owner<'_>, component: Component) -> Service {
    let mut ports = Vec::with_capacity(2);
    match component {
        Component::Gateway => ports.push(port(HTTP_PORT_NAME, GATEWAY_SERVICE_PORT)),
        Component::Inventory => ports.push(port(HTTP_PORT_NAME, HTTP_PORT)),
        Component::OrderWriter => {}
    }
    ports.push(port(OPS_PORT_NAME, OPS_PORT));
    Service {
        metadata: owner.object_meta(names::workload(owner.sale, component), component),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(labels::selector(owner.name, component)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
