//! Redis answers real commands.

use flashsale_e2e::stack;
use redis::AsyncCommands;

#[tokio::test]
async fn redis_set_get_and_server_info() -> anyhow::Result<()> {
    let client = redis::Client::open(stack::redis_url()?)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let key = format!("fs:{{{}}}:smoke", stack::unique_name("redis"));

    let _: () = conn.set_ex(&key, "stock-42", 60).await?;
    let value: String = conn.get(&key).await?;
    assert_eq!(value, "stock-42");
    let after: i64 = conn.decr(format!("{key}:n"), 1).await?;
    assert_eq!(after, -1);

    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    assert!(
        info.contains("redis_version:"),
        "not a Redis server: {info}"
    );
    let _: () = conn.del(&[key.clone(), format!("{key}:n")]).await?;
    Ok(())
}
