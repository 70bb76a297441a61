//! A TCP proxy that holds every byte sent to its upstream for a delay the
//! test sets and changes while it runs: a slow dependency, owned by the
//! test, in front of a real one. Answers come back at once, so a
//! request/answer exchange takes the delay once.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, tcp::OwnedReadHalf, tcp::OwnedWriteHalf},
    sync::mpsc,
    task::JoinHandle,
    time::Instant,
};

/// The proxy; stops when dropped.
pub struct DelayProxy {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    delay_us: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl DelayProxy {
    /// A proxy to `upstream` (`host:port` or a URL's `http://host:port`),
    /// without delay until [`DelayProxy::set_delay`].
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/');
        let upstream: SocketAddr = tokio::net::lookup_host(upstream)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("no address for {upstream}")))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let delay_us = Arc::new(AtomicU64::new(0));
        let delay = delay_us.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let delay = delay.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        relay(client, server, delay).await;
                    }
                });
            }
        });
        Ok(Self {
            url,
            delay_us,
            task,
        })
    }

    /// Holds what is sent upstream from now on for `delay`.
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.delay_us.store(us, Ordering::Relaxed);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways until either side closes, the upstream direction held
/// for the delay at the time each chunk arrived, in order.
async fn relay(client: TcpStream, server: TcpStream, delay_us: Arc<AtomicU64>) {
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = server.into_split();
    let (chunks, due) = mpsc::unbounded_channel();
    let upstream = tokio::spawn(hold_and_send(due, server_write));
    let downstream = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = server_read.read(&mut buf).await {
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = read_chunks(client_read, chunks, delay_us) => {}
        () = downstream => {}
    }
    upstream.abort();
}

/// Reads the client's bytes, stamping each chunk with when it is due.
async fn read_chunks(
    mut from: OwnedReadHalf,
    chunks: mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    delay_us: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        let due = Instant::now() + Duration::from_micros(delay_us.load(Ordering::Relaxed));
        if chunks.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
}

/// Sends each chunk upstream once it is due.
async fn hold_and_send(
    mut due: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to: OwnedWriteHalf,
) {
    while let Some((at, chunk)) = due.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            break;
        }
    }
}
