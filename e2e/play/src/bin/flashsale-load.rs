//! `flashsale-load`: plays buyers against a sale's gateway for a while and
//! prints what happened.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use clap::Parser;
use flashsale_play::buyers::{self, Config, Counters, Profile, Progress, RetryPolicy, SkuLimit};

/// Plays buyers against a flash sale's gateway, the way real shoppers do:
/// they think, browse and buy (through the waiting room when there is one),
/// pay most orders and abandon some. The number of active buyers follows
/// the usual shape of a sale over --duration: warm-up at 10%, ramp up,
/// plateau at --users, ramp down, tail at 10%. Stops at the end of the
/// duration or on Ctrl-C (buyers finish the purchase they are in), then
/// prints the tally as JSON.
#[derive(Debug, Parser)]
#[command(name = "flashsale-load", version)]
struct Args {
    /// Base URL of the sale's gateway.
    #[arg(long, value_name = "URL", env = "FLASHSALE_GATEWAY")]
    gateway: String,
    /// File holding the HS256 secret the gateway verifies bearer tokens with.
    #[arg(long, value_name = "FILE")]
    jwt_secret_file: PathBuf,
    /// File holding the secret payment callbacks are signed with (≥ 32 bytes).
    #[arg(long, value_name = "FILE")]
    payment_secret_file: PathBuf,
    /// A SKU on sale and the per-user limit (default 1); repeat for each SKU.
    #[arg(long = "sku", value_name = "SKU[:LIMIT]", required = true, value_parser = sku_limit)]
    skus: Vec<SkuLimit>,
    /// Buyers at the peak.
    #[arg(long, default_value_t = 100)]
    users: usize,
    /// How long the sale is played, e.g. 90s, 5m, 1m30s.
    #[arg(long, default_value = "60s", value_parser = duration)]
    duration: Duration,
    /// Mean think time between two actions (exponentially distributed).
    #[arg(long, default_value = "1s", value_parser = duration)]
    think: Duration,
    /// Share (0-1) of acknowledged orders never paid.
    #[arg(long, default_value_t = 0.25)]
    abandon: f64,
    /// Share (0-1) of actions that are purchase attempts; the rest browse.
    #[arg(long, default_value_t = 0.5)]
    purchase_share: f64,
    /// Share (0-1) of page views a buyer reloads impatiently, several times
    /// in a row (what the per-user rate limit refuses).
    #[arg(long, default_value_t = 0.1)]
    impatient: f64,
    /// Seed of the buyers' random choices.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Bound of one HTTP request.
    #[arg(long, default_value = "5s", value_parser = duration)]
    http_timeout: Duration,
    /// Write the ledger (every acknowledged order and unresolved purchase,
    /// per buyer) to this file as JSON.
    #[arg(long, value_name = "FILE")]
    ledger: Option<PathBuf>,
}

fn sku_limit(text: &str) -> Result<SkuLimit, String> {
    let (sku, limit) = match text.split_once(':') {
        Some((sku, limit)) => (
            sku,
            limit
                .parse()
                .map_err(|_| format!("the limit in {text:?} is not a whole number"))?,
        ),
        None => (text, 1),
    };
    if sku.is_empty() {
        return Err("an empty SKU".to_owned());
    }
    Ok(SkuLimit {
        sku: sku.to_owned(),
        limit,
    })
}

fn duration(text: &str) -> Result<Duration, String> {
    let parsed: jiff::SignedDuration = text
        .parse()
        .map_err(|e| format!("{text:?} is not a duration like 90s or 1m30s: {e}"))?;
    Duration::try_from(parsed).map_err(|_| format!("{text:?} is negative"))
}

fn secret(path: &PathBuf, what: &str) -> anyhow::Result<Vec<u8>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("reading the {what} {}", path.display()))?;
    // As the gateway reads it: a trailing newline is not part of the secret.
    Ok(bytes.trim_ascii().to_vec())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let profile = Profile::sale(args.duration);
    let config = Config {
        gateway: args.gateway,
        jwt_secret: secret(&args.jwt_secret_file, "JWT secret")?,
        payment_secret: secret(&args.payment_secret_file, "payment secret")?,
        skus: args.skus,
        users: args.users,
        profile: profile.clone(),
        think: args.think,
        abandon: args.abandon,
        purchase_share: args.purchase_share,
        impatient: args.impatient,
        seed: args.seed,
        http_timeout: args.http_timeout,
        retry: RetryPolicy::default(),
    };
    let progress = Progress::new(profile.total());
    let stop = {
        let progress = progress.clone();
        async move {
            tokio::select! {
                () = tokio::time::sleep(profile.total()) => {}
                _ = tokio::signal::ctrl_c() => progress.line("interrupted: buyers finish their purchases"),
            }
        }
    };
    let outcome = buyers::run(config, progress, Counters::default(), stop).await?;
    if let Some(path) = &args.ledger {
        std::fs::write(path, outcome.ledger.to_json()?)
            .with_context(|| format!("writing the ledger {}", path.display()))?;
    }
    println!("{}", serde_json::to_string_pretty(&outcome.tally)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skus_take_an_optional_limit() {
        assert_eq!(
            sku_limit("A:3"),
            Ok(SkuLimit {
                sku: "A".into(),
                limit: 3
            })
        );
        assert_eq!(
            sku_limit("B"),
            Ok(SkuLimit {
                sku: "B".into(),
                limit: 1
            })
        );
        assert!(sku_limit("A:x").is_err());
        assert!(sku_limit(":2").is_err());
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(duration("-5s").is_err());
        assert!(duration("soon").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}
