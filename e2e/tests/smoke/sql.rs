//! PostgreSQL and MariaDB answer real SQL through sqlx. The tables are
//! temporary, so concurrent tests on other connections never see them.

use flashsale_e2e::stack;
use sqlx::{Connection, MySqlConnection, PgConnection, Row};

#[tokio::test]
async fn postgres_round_trip() -> anyhow::Result<()> {
    let mut conn = PgConnection::connect(&stack::postgres_url()?).await?;
    let version: String = sqlx::query_scalar("SELECT version()")
        .fetch_one(&mut conn)
        .await?;
    assert!(version.starts_with("PostgreSQL"), "{version}");

    sqlx::query("CREATE TEMPORARY TABLE smoke_stock (sku TEXT PRIMARY KEY, stock BIGINT NOT NULL)")
        .execute(&mut conn)
        .await?;
    sqlx::query("INSERT INTO smoke_stock VALUES ($1, $2), ($3, $4)")
        .bind("sku-1")
        .bind(10_i64)
        .bind("sku-2")
        .bind(5_i64)
        .execute(&mut conn)
        .await?;
    let row = sqlx::query(
        "UPDATE smoke_stock SET stock = stock - 1 WHERE sku = $1 AND stock > 0 RETURNING stock",
    )
    .bind("sku-1")
    .fetch_one(&mut conn)
    .await?;
    assert_eq!(row.try_get::<i64, _>("stock")?, 9);
    let total: i64 = sqlx::query_scalar("SELECT SUM(stock)::BIGINT FROM smoke_stock")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(total, 14);
    Ok(())
}

#[tokio::test]
async fn mariadb_round_trip() -> anyhow::Result<()> {
    let mut conn = MySqlConnection::connect(&stack::mysql_url()?).await?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut conn)
        .await?;
    assert!(version.contains("MariaDB"), "{version}");

    sqlx::query(
        "CREATE TEMPORARY TABLE smoke_stock (sku VARCHAR(64) PRIMARY KEY, stock BIGINT NOT NULL)",
    )
    .execute(&mut conn)
    .await?;
    sqlx::query("INSERT INTO smoke_stock VALUES (?, ?), (?, ?)")
        .bind("sku-1")
        .bind(10_i64)
        .bind("sku-2")
        .bind(5_i64)
        .execute(&mut conn)
        .await?;
    // Idempotent insert, as the order-writer will do it: the duplicate changes nothing.
    sqlx::query("INSERT INTO smoke_stock VALUES (?, ?) ON DUPLICATE KEY UPDATE stock = stock")
        .bind("sku-1")
        .bind(99_i64)
        .execute(&mut conn)
        .await?;
    let kept: i64 = sqlx::query_scalar("SELECT stock FROM smoke_stock WHERE sku = ?")
        .bind("sku-1")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(kept, 10);
    let total: i64 = sqlx::query_scalar("SELECT CAST(SUM(stock) AS SIGNED) FROM smoke_stock")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(total, 15);
    Ok(())
}
