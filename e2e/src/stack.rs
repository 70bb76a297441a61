//! Where the local stack's components listen, from the variables that
//! `e2e/local/stack env` exports.

/// A component's address is unknown because its variable is not set.
#[derive(Debug, thiserror::Error)]
#[error(
    "{var} is not set, so the {component} of the local stack cannot be found. Run the tests \
     through `e2e/local/stack test`, or start the stack with `e2e/local/stack up` and load its \
     variables with `eval \"$(e2e/local/stack env)\"`"
)]
pub struct MissingComponent {
    /// The environment variable that was looked up.
    pub var: &'static str,
    /// The component it names.
    pub component: &'static str,
}

fn var(var: &'static str, component: &'static str) -> Result<String, MissingComponent> {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or(MissingComponent { var, component })
}

/// `redis://` URL of Redis.
pub fn redis_url() -> Result<String, MissingComponent> {
    var("REDIS_URL", "Redis server")
}

/// `postgres://` URL of the PostgreSQL database.
pub fn postgres_url() -> Result<String, MissingComponent> {
    var("DATABASE_URL", "PostgreSQL database")
}

/// `mysql://` URL of the MariaDB database.
pub fn mysql_url() -> Result<String, MissingComponent> {
    var("MYSQL_URL", "MariaDB database")
}

/// Bootstrap servers of the Kafka broker.
pub fn kafka_brokers() -> Result<String, MissingComponent> {
    var("KAFKA_BROKERS", "Kafka broker")
}

/// Base URL of Prometheus.
pub fn prometheus_url() -> Result<String, MissingComponent> {
    var("PROMETHEUS_URL", "Prometheus server")
}

/// Folder of file_sd JSON files Prometheus scrapes targets from.
pub fn prometheus_targets_dir() -> Result<String, MissingComponent> {
    var("PROMETHEUS_TARGETS_DIR", "Prometheus target folder")
}

/// Path of the admin kubeconfig of the local control plane.
pub fn kubeconfig() -> Result<String, MissingComponent> {
    var("KUBECONFIG", "Kubernetes control plane")
}

/// The image Chaos Mesh's pod-failure puts in place of every container's.
pub fn chaos_mesh_pause_image() -> Result<String, MissingComponent> {
    var(
        "CHAOS_MESH_PAUSE_IMAGE",
        "Chaos Mesh controller's pause image",
    )
}

/// Path of the `e2e/local/stack` script that started the stack, for tests
/// that stop and start a component.
pub fn script() -> Result<String, MissingComponent> {
    var("FLASHSALE_STACK", "stack script")
}

/// Socket of the real node's containerd (images in namespace `k8s.io`).
pub fn containerd_address() -> Result<String, MissingComponent> {
    var("CONTAINERD_ADDRESS", "real node's containerd")
}

/// Name of the stack's real node (kubelet + containerd), where pods run.
pub fn real_node() -> Result<String, MissingComponent> {
    var("FLASHSALE_NODE", "real node")
}

/// The stack's stores and Prometheus as pods on the real node reach them: through the
/// `flashsale-stack` namespace's Services.
pub mod in_cluster {
    use super::{MissingComponent, var};

    /// `redis://` URL of Redis.
    pub fn redis_url() -> Result<String, MissingComponent> {
        var("POD_REDIS_URL", "Redis server (from pods)")
    }

    /// `postgres://` URL of the PostgreSQL database.
    pub fn database_url() -> Result<String, MissingComponent> {
        var("POD_DATABASE_URL", "PostgreSQL database (from pods)")
    }

    /// Bootstrap servers of the Kafka broker.
    pub fn kafka_brokers() -> Result<String, MissingComponent> {
        var("POD_KAFKA_BROKERS", "Kafka broker (from pods)")
    }

    /// Base URL of Prometheus.
    pub fn prometheus_url() -> Result<String, MissingComponent> {
        var("POD_PROMETHEUS_URL", "Prometheus server (from pods)")
    }
}

/// A name unique to this test run, for topics, keys, namespaces and tables,
/// so tests never see each other's data. Lowercase, DNS-label safe.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos:x}-{n}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_differ_and_are_dns_labels() {
        let a = unique_name("t");
        let b = unique_name("t");
        assert_ne!(a, b);
        for name in [a, b] {
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
    }

    #[test]
    fn missing_variable_says_how_to_start_the_stack() {
        let err = var("FLASHSALE_SURELY_UNSET_VARIABLE", "thing").err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("FLASHSALE_SURELY_UNSET_VARIABLE is not set"),
            "{text}"
        );
        assert!(text.contains("e2e/local/stack test"), "{text}");
    }
}
