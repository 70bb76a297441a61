//! Prometheus scrapes a real target of ours and answers PromQL.

use std::time::Duration;

use flashsale_e2e::{stack, wait::poll_until};
use flashsale_runtime::{OpsServer, Readiness, Shutdown};
use prometheus_client::{metrics::gauge::Gauge, registry::Registry};
use prometheus_http_query::Client;

/// Removes the target file when the test ends, passed or not.
struct TargetFile(std::path::PathBuf);

impl Drop for TargetFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn prometheus_scrapes_our_endpoint_and_answers_up() -> anyhow::Result<()> {
    let client: Client = stack::prometheus_url()?.parse()?;

    // Prometheus always scrapes itself: `up` has at least one live series.
    let up = client.query("up == 1").get().await?;
    let live = up.data().as_vector().map(|v| v.len()).unwrap_or(0);
    assert!(live >= 1, "no live scrape target: {up:?}");

    // Now a target of our own: an ops server with a gauge Prometheus must read.
    let mut registry = Registry::default();
    let marker = Gauge::<i64>::default();
    marker.set(4242);
    registry.register(
        "smoke_marker",
        "Value the smoke test expects to see",
        marker,
    );
    let server = OpsServer::bind("127.0.0.1:0".parse()?, registry, Readiness::default()).await?;
    let addr = server.local_addr()?;
    let shutdown = Shutdown::new();
    let serving = tokio::spawn(server.serve(shutdown.clone()));

    let instance = addr.to_string();
    let name = stack::unique_name("smoke");
    let path = std::path::Path::new(&stack::prometheus_targets_dir()?).join(format!("{name}.json"));
    let _cleanup = TargetFile(path.clone());
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!(r#"[{{"targets":["{instance}"],"labels":{{"test":"{name}"}}}}]"#),
    )?;
    std::fs::rename(&tmp, &path)?;

    let query = format!(r#"smoke_marker{{instance="{instance}",test="{name}"}}"#);
    let value = poll_until(
        "Prometheus to scrape the test target",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || {
            let client = client.clone();
            let query = query.clone();
            async move {
                let response = client
                    .query(query.as_str())
                    .get()
                    .await
                    .map_err(|e| e.to_string())?;
                response
                    .data()
                    .as_vector()
                    .and_then(|v| v.first().map(|s| s.sample().value()))
                    .ok_or_else(|| "no sample yet".to_owned())
            }
        },
    )
    .await?;
    assert_eq!(value, 4242.0);

    shutdown.trigger();
    serving.await??;
    Ok(())
}
