//! What the store tests share: a fresh sale on a Redis (one server or a
//! cluster), the concurrent no-oversell hammer, and the inventory binary
//! as a child process.

// Each test binary uses only part of this.
#![allow(dead_code)]

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use inventory::store::{
    ConfirmOutcome, ItemDefinition, ReserveOutcome, ReserveRequest, SaleDefinition, Store,
};

/// A store on `url` with a fresh sale of one SKU, `HOT`.
pub async fn store_on(
    url: &str,
    sale: &str,
    stock: u64,
    limit: u64,
    shards: u32,
    ttl_ms: u64,
) -> anyhow::Result<(Store, String)> {
    let store = Store::connect(url).await?;
    let sale = sale.to_owned();
    store
        .load(&SaleDefinition {
            sale: sale.clone(),
            opens_at_ms: None,
            reservation_ttl_ms: ttl_ms,
            items: vec![ItemDefinition {
                sku: "HOT".into(),
                stock,
                per_user_limit: limit,
                shards,
            }],
        })
        .await?;
    Ok((store, sale))
}

/// A request for 2 units of `HOT` at 200 by `user`, for tests that stage a
/// sharded claim with [`inventory::store::admission`].
pub fn claim_request<'a>(sale: &'a str, user: &'a str, request_id: &'a str) -> ReserveRequest<'a> {
    ReserveRequest {
        sale,
        sku: "HOT",
        user,
        quantity: 2,
        request_id,
        amount_minor: 200,
    }
}

/// The stock of `HOT`.
pub async fn stock_of(store: &Store, sale: &str) -> anyhow::Result<inventory::store::StockLevel> {
    store
        .stock(sale, "HOT")
        .await?
        .ok_or_else(|| anyhow::anyhow!("SKU HOT of {sale} is not loaded"))
}

/// Reserves `qty` of `HOT`.
pub async fn reserve(
    store: &Store,
    sale: &str,
    user: &str,
    qty: u64,
    request_id: &str,
) -> anyhow::Result<ReserveOutcome> {
    Ok(store
        .reserve(&ReserveRequest {
            sale,
            sku: "HOT",
            user,
            quantity: qty,
            request_id,
            amount_minor: qty * 100,
        })
        .await?)
}

/// Units the test itself asked for and was granted. A call is counted in
/// `asked` before it is made and in `granted` once it answered yes, so at
/// any instant the store's count must lie between the two.
#[derive(Default)]
struct Ledger {
    reserve_asked: AtomicU64,
    reserved: AtomicU64,
    confirm_asked: AtomicU64,
    confirmed: AtomicU64,
}

impl Ledger {
    /// Checks a stock reading taken between two loads of the ledger.
    fn bracket(
        &self,
        before: [u64; 4],
        level: &inventory::store::StockLevel,
    ) -> Result<(), String> {
        let after = self.load();
        let held = level.reserved + level.sold;
        // granted-before <= store <= asked-after, for held units and sold units.
        if held < before[1] || held > after[0] || level.sold < before[3] || level.sold > after[2] {
            return Err(format!(
                "store {level:?} outside the test's own books: before {before:?}, after {after:?}"
            ));
        }
        Ok(())
    }

    fn load(&self) -> [u64; 4] {
        [
            self.reserve_asked.load(Ordering::SeqCst),
            self.reserved.load(Ordering::SeqCst),
            self.confirm_asked.load(Ordering::SeqCst),
            self.confirmed.load(Ordering::SeqCst),
        ]
    }
}

/// The hammer's stock.
const STOCK: u64 = 1_000;

/// 200 concurrent clients, 800 users, stock 1,000, limit 2: nothing oversold,
/// nobody over the limit, and the store's counts agree at every check with
/// the units the test itself reserved and confirmed.
pub async fn hammer(url: &str, sale: &str, shards: u32) -> anyhow::Result<()> {
    let (store, sale) = store_on(url, sale, STOCK, 2, shards, 600_000).await?;
    let done = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicU64::new(0));
    let ledger = Arc::new(Ledger::default());
    let checker = spawn_checker(&store, &sale, &done, &checks, &ledger);
    reserve_concurrently(&store, &sale, &ledger).await?;
    buy_leftovers(&store, &sale, &ledger).await?;
    done.store(true, Ordering::SeqCst);
    checker.await??;
    check_books(&store, &sale, &ledger, &checks, shards).await
}

/// Reads the stock over and over until `done`, each reading checked
/// against the ledger; counts the readings in `checks`.
fn spawn_checker(
    store: &Store,
    sale: &str,
    done: &Arc<AtomicBool>,
    checks: &Arc<AtomicU64>,
    ledger: &Arc<Ledger>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let (store, sale, done, checks, ledger) = (
        store.clone(),
        sale.to_owned(),
        done.clone(),
        checks.clone(),
        ledger.clone(),
    );
    tokio::spawn(async move {
        while !done.load(Ordering::SeqCst) {
            let before = ledger.load();
            let level = stock_of(&store, &sale).await?;
            ledger.bracket(before, &level).map_err(anyhow::Error::msg)?;
            anyhow::ensure!(level.stock == STOCK, "stock changed: {level:?}");
            checks.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
        }
        anyhow::Ok(())
    })
}

/// 200 clients, 4 users each, each user reserving 1 or 2 units up to three
/// times and confirming some; every call and grant goes into the ledger.
async fn reserve_concurrently(
    store: &Store,
    sale: &str,
    ledger: &Arc<Ledger>,
) -> anyhow::Result<()> {
    let clients: Vec<_> = (0..200)
        .map(|client| {
            let (store, sale, ledger) = (store.clone(), sale.to_owned(), ledger.clone());
            tokio::spawn(async move {
                for k in 0..4 {
                    let user = format!("u{}", client * 4 + k);
                    for attempt in 0..3 {
                        let qty = 1 + (client + k + attempt) % 2;
                        let rid = format!("{user}-{attempt}");
                        ledger.reserve_asked.fetch_add(qty, Ordering::SeqCst);
                        match reserve(&store, &sale, &user, qty, &rid).await? {
                            ReserveOutcome::Reserved(r) => {
                                ledger.reserved.fetch_add(qty, Ordering::SeqCst);
                                if (client + attempt) % 3 == 0 {
                                    ledger.confirm_asked.fetch_add(qty, Ordering::SeqCst);
                                    if store.confirm(&sale, &r.id).await?
                                        == ConfirmOutcome::Confirmed
                                    {
                                        ledger.confirmed.fetch_add(qty, Ordering::SeqCst);
                                    }
                                }
                            }
                            ReserveOutcome::SoldOut | ReserveOutcome::UserLimit { .. } => break,
                            other => anyhow::bail!("unexpected {other:?}"),
                        }
                    }
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for client in clients {
        client.await??;
    }
    Ok(())
}

/// Requests of 2 can leave single units behind; buys them one at a time
/// until sold out.
async fn buy_leftovers(store: &Store, sale: &str, ledger: &Ledger) -> anyhow::Result<()> {
    for n in 0.. {
        ledger.reserve_asked.fetch_add(1, Ordering::SeqCst);
        match reserve(store, sale, &format!("late-{n}"), 1, &format!("late-{n}")).await? {
            ReserveOutcome::Reserved(_) => {
                ledger.reserved.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            ReserveOutcome::SoldOut => break,
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    Ok(())
}

/// The end of the hammer: the store holds exactly what the ledger was
/// granted, nobody holds over the limit, and few units went to the
/// single-unit buyers.
async fn check_books(
    store: &Store,
    sale: &str,
    ledger: &Ledger,
    checks: &AtomicU64,
    shards: u32,
) -> anyhow::Result<()> {
    let level = stock_of(store, sale).await?;
    let [_, reserved, _, confirmed] = ledger.load();
    // Exactly what the test was granted: every unit accounted for.
    assert_eq!(reserved, STOCK, "the test was granted the whole stock");
    assert_eq!(level.available, 0, "{level:?}");
    assert_eq!(level.sold, confirmed, "{level:?}");
    assert_eq!(level.reserved, reserved - confirmed, "{level:?}");
    assert!(confirmed > 0, "some were confirmed: {level:?}");
    assert!(
        // How many reads overlap the clients depends on scheduling; one is the proof.
        checks.load(Ordering::SeqCst) >= 1,
        "the checker ran while clients did"
    );
    let mut held_total = 0;
    for user in (0..800).map(|u| format!("u{u}")) {
        let held = store.held_by(sale, "HOT", &user).await?;
        assert!(held <= 2, "{user} holds {held}");
        held_total += held;
    }
    let late: u64 = level.reserved + level.sold - held_total;
    assert!(
        late <= 8 * u64::from(shards),
        "{late} units left for the single-unit buyers"
    );
    Ok(())
}

/// The inventory binary as a child process, serving its API and ops ports
/// on loopback; killed when dropped.
pub struct InventoryProcess {
    child: tokio::process::Child,
    /// Base URL of its API.
    pub api: String,
    /// Base URL of its ops server.
    pub ops: String,
    /// A client for it.
    pub http: reqwest::Client,
    log: std::path::PathBuf,
}

impl InventoryProcess {
    /// Starts the binary on `redis_url` with the sale file `def` and
    /// `extra` arguments; its log goes to a file [`Self::log`] reads.
    pub fn start(redis_url: &str, def: &SaleDefinition, extra: &[&str]) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir();
        let name = flashsale_e2e::stack::unique_name("inventory");
        let sale_file = dir.join(format!("{name}.json"));
        std::fs::write(&sale_file, serde_json::to_vec(def)?)?;
        let log = dir.join(format!("{name}.log"));
        let (api, ops) = (free_port()?, free_port()?);
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_inventory"))
            .args(["--redis-url", redis_url])
            .arg("--sale-file")
            .arg(&sale_file)
            .args(["--listen", &format!("127.0.0.1:{api}")])
            .args(["--ops-addr", &format!("127.0.0.1:{ops}")])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self {
            child,
            api: format!("http://127.0.0.1:{api}"),
            ops: format!("http://127.0.0.1:{ops}"),
            http: reqwest::Client::new(),
            log,
        })
    }

    /// SIGKILL: no shutdown path runs.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A port free on loopback a moment ago.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
