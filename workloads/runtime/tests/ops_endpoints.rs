//! The ops endpoints over real HTTP on loopback.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use flashsale_runtime::{OpsServer, Readiness, Shutdown, register_process_info};
use prometheus_client::{metrics::counter::Counter, registry::Registry};

#[tokio::test]
async fn healthz_readyz_and_metrics_follow_the_process_state() -> anyhow::Result<()> {
    let mut registry = Registry::default();
    register_process_info(&mut registry, "test-component", "1.2.3");
    let requests = Counter::<u64>::default();
    registry.register("demo_requests", "Requests seen", requests.clone());
    requests.inc_by(7);

    let dependency_up = Arc::new(AtomicBool::new(false));
    let flag = dependency_up.clone();
    let readiness = Readiness::default().with_check("dependency", move || {
        let up = flag.load(Ordering::SeqCst);
        async move {
            if up {
                Ok(())
            } else {
                Err("dependency unreachable".to_owned())
            }
        }
    });

    let server = OpsServer::bind("127.0.0.1:0".parse()?, registry, readiness).await?;
    let base = format!("http://{}", server.local_addr()?);
    let shutdown = Shutdown::new();
    let serving = tokio::spawn(server.serve(shutdown.clone()));
    let http = reqwest::Client::new();

    let health = http.get(format!("{base}/healthz")).send().await?;
    assert_eq!(health.status(), 200);

    let unready = http.get(format!("{base}/readyz")).send().await?;
    assert_eq!(unready.status(), 503);
    let body: serde_json::Value = unready.json().await?;
    assert_eq!(body["ready"], false);
    assert_eq!(body["checks"]["dependency"], "dependency unreachable");

    dependency_up.store(true, Ordering::SeqCst);
    let ready = http.get(format!("{base}/readyz")).send().await?;
    assert_eq!(ready.status(), 200);

    let metrics = http.get(format!("{base}/metrics")).send().await?;
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await?;
    assert!(text.contains("demo_requests_total 7"), "{text}");
    assert!(
        text.contains(r#"flashsale_build_info{component="test-component",version="1.2.3"} 1"#),
        "{text}"
    );
    let started = text
        .lines()
        .find_map(|l| l.strip_prefix("process_start_time_seconds "))
        .and_then(|v| v.parse::<f64>().ok());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    assert!(
        started.is_some_and(|s| s <= now.as_secs_f64() && s > now.as_secs_f64() - 60.0),
        "{text}"
    );

    shutdown.trigger();
    serving.await??;
    Ok(())
}
