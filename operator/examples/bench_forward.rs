//! Benchmark: what reaching a Service through the apiserver costs (the
//! suite's `--reach apiserver`, as a CI job reaches a kind cluster), beside
//! its cluster IP, for a request on a new connection (each buyer's device)
//! and on one kept-alive connection.
//!
//! The Service is the chart-installed operator's metrics Service (two pods
//! on the real node; `e2e/local/stack up operator`), asked `GET /healthz`.
//! Each round asks `--requests` times per way, the ways in turn; a round's
//! ratio is its forward p50 over its cluster-IP p50, and the figures are
//! medians over the rounds.
//!
//! ```text
//! eval "$(e2e/local/stack env)"
//! cargo run --release -p flashsale-operator --example bench_forward -- --rounds 5
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use flashsale_bench::{Recorder, median};
use flashsale_e2e::reach::Reach;

#[derive(Debug, Parser)]
#[command(
    about = "Time requests to a Service through the apiserver against its cluster IP, on new and on kept-alive connections"
)]
struct Args {
    /// Rounds; the figures are medians over them.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Requests per way and round.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// The Service's namespace.
    #[arg(long, default_value = "flashsale-system")]
    namespace: String,
    /// The Service.
    #[arg(long, default_value = "flashsale-operator-metrics")]
    service: String,
    /// Its port.
    #[arg(long, default_value_t = 9090)]
    port: u16,
    /// The path asked.
    #[arg(long, default_value = "/healthz")]
    path: String,
}

/// One way of asking: by which reach, on which kind of connection.
#[derive(Debug, Clone, Copy)]
struct Way {
    reach: Reach,
    new_connections: bool,
}

impl Way {
    fn name(self) -> String {
        let reach = match self.reach {
            Reach::ServiceIp => "cluster IP",
            Reach::Apiserver => "apiserver",
        };
        let connection = if self.new_connections {
            "new connection each"
        } else {
            "kept alive"
        };
        format!("{reach}, {connection}")
    }
}

const WAYS: [Way; 4] = [
    Way {
        reach: Reach::ServiceIp,
        new_connections: true,
    },
    Way {
        reach: Reach::Apiserver,
        new_connections: true,
    },
    Way {
        reach: Reach::ServiceIp,
        new_connections: false,
    },
    Way {
        reach: Reach::Apiserver,
        new_connections: false,
    },
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = flashsale_e2e::kube::client().await?;
    let mut urls = Vec::new();
    // Kept for the whole run: dropping one closes its forward.
    let mut reached = Vec::new();
    for way in WAYS {
        let to = way
            .reach
            .service(&client, &args.namespace, &args.service, args.port)
            .await?;
        urls.push(format!("http://{}{}", to.address, args.path));
        reached.push(to);
    }
    // p50 and p99 in ms per way and round.
    let mut figures: Vec<Vec<(f64, f64)>> = vec![Vec::new(); WAYS.len()];
    for round in 1..=args.rounds {
        for (i, way) in WAYS.iter().enumerate() {
            let times = ask(&urls[i], args.requests, way.new_connections).await?;
            let ms = |q| {
                times
                    .quantile(q)
                    .map_or(f64::NAN, |d: Duration| d.as_secs_f64() * 1e3)
            };
            figures[i].push((ms(0.5), ms(0.99)));
            eprintln!(
                "round {round}: {}: p50 {:.2} ms, p99 {:.2} ms",
                way.name(),
                ms(0.5),
                ms(0.99)
            );
        }
    }
    println!("| way | p50 ms | p99 ms | apiserver / cluster IP (p50) |");
    println!("|---|---|---|---|");
    for (i, way) in WAYS.iter().enumerate() {
        let p50 = median(figures[i].iter().map(|f| f.0));
        let p99 = median(figures[i].iter().map(|f| f.1));
        // The same kind of connection by cluster IP, in the same rounds.
        let base = i & !1;
        let ratio = median(
            figures[i]
                .iter()
                .zip(&figures[base])
                .map(|(this, ip)| this.0 / ip.0),
        );
        let show = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
        println!(
            "| {} | {} | {} | {} |",
            way.name(),
            show(p50),
            show(p99),
            show(ratio)
        );
    }
    drop(reached);
    Ok(())
}

/// `requests` GETs of `url`, each on a new connection or all on one; the
/// time of each; the first failure as an error.
async fn ask(url: &str, requests: usize, new_connections: bool) -> anyhow::Result<Recorder> {
    let http = if new_connections {
        flashsale_e2e::real_node::http_per_request()?
    } else {
        flashsale_e2e::real_node::http()?
    };
    let mut times = Recorder::new();
    for _ in 0..requests {
        let started = Instant::now();
        let answer = http.get(url).send().await?;
        anyhow::ensure!(answer.status().is_success(), "{url}: {}", answer.status());
        answer.bytes().await?;
        times.record(started.elapsed());
    }
    Ok(times)
}
