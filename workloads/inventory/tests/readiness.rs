//! `/readyz` follows Redis: ready while it answers, not ready once it is gone.

use std::time::Duration;

use flashsale_e2e::{private_redis::PrivateRedis, wait::poll_until};
use flashsale_runtime::{OpsServer, Readiness, Shutdown};
use inventory::store::Store;
use prometheus_client::registry::Registry;

#[tokio::test]
async fn readyz_fails_when_redis_goes_away() -> anyhow::Result<()> {
    // A Redis of this test's own, so stopping it disturbs nobody.
    let mut redis = PrivateRedis::start(&[]).await?;
    let store = Store::connect(&redis.url).await?;

    let check_store = store.clone();
    let readiness = Readiness::default().with_check("redis", move || {
        let store = check_store.clone();
        async move { store.ping().await.map_err(|e| e.to_string()) }
    });
    let server = OpsServer::bind("127.0.0.1:0".parse()?, Registry::default(), readiness).await?;
    let readyz = format!("http://{}/readyz", server.local_addr()?);
    let shutdown = Shutdown::new();
    tokio::spawn(server.serve(shutdown.clone()));
    let http = reqwest::Client::new();
    assert_eq!(http.get(&readyz).send().await?.status(), 200);

    redis.kill().await?;
    let body = poll_until(
        "/readyz to fail",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || {
            let (http, readyz) = (http.clone(), readyz.clone());
            async move {
                let response = http.get(&readyz).send().await.map_err(|e| e.to_string())?;
                if response.status() == 503 {
                    response
                        .json::<serde_json::Value>()
                        .await
                        .map_err(|e| e.to_string())
                } else {
                    Err(format!("still {}", response.status()))
                }
            }
        },
    )
    .await?;
    assert_eq!(body["ready"], false);
    assert_ne!(body["checks"]["redis"], "ok", "{body}");
    shutdown.trigger();
    Ok(())
}
