//! The waiting room's HTTP face: who may read a queue status, where its
//! ticket may travel, the cookies it sets, the pass lease the order route
//! takes, and the `/queue` page.

mod common;

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use common::{Funnel, Options, http, order, token, wait_for_pass, wait_past};
use flashsale_e2e::wait::poll_until;
use gateway::{
    auth::User,
    queue::{Entry, PASS_HEADER, lease_pass},
    waiting_room::PassLease,
};
use serde_json::{Value, json};

fn room(admit_per_second: u32) -> Value {
    json!({"waitingRoom": {"enabled": true, "admitPerSecond": admit_per_second, "passTtlSeconds": 60}})
}

/// A queue-status request: the ticket in the header, `bearer` as the token.
async fn status(
    gateway: &str,
    ticket: Option<&str>,
    bearer: Option<&str>,
    query: &str,
) -> anyhow::Result<(u16, Value)> {
    let mut request = http().get(format!("{gateway}/api/v1/queue/status{query}"));
    if let Some(ticket) = ticket {
        request = request.header("x-queue-ticket", ticket);
    }
    if let Some(user) = bearer {
        request = request.bearer_auth(token(user));
    }
    let response = request.send().await?;
    let code = response.status().as_u16();
    Ok((code, response.json().await.unwrap_or(Value::Null)))
}

#[tokio::test]
async fn the_status_needs_the_buyers_token_and_no_ticket_in_the_url() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: room(1),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    order(gw, "first", "A", "k", None).await?;
    let (code, body, _) = order(gw, "me", "A", "k", None).await?;
    assert_eq!(code, 202, "{body}");
    let ticket = body["ticket"].as_str().unwrap_or_default().to_owned();

    // A ticket alone no longer reads the queue: the buyer's token is needed.
    let (code, body) = status(gw, Some(&ticket), None, "").await?;
    assert_eq!(
        (code, body["error"].as_str()),
        (401, Some("missing_token")),
        "{body}"
    );
    let (code, body) = status(gw, Some(&ticket), Some("someone-else"), "").await?;
    assert_eq!(
        (code, body["error"].as_str()),
        (403, Some("other_user")),
        "{body}"
    );
    let (code, body) = status(gw, Some(&ticket), Some("me"), "").await?;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["position"], 2, "{body}");

    // Never in the URL, not even beside a good header.
    let query = format!("?ticket={ticket}");
    let (code, body) = status(gw, None, Some("me"), &query).await?;
    assert_eq!(code, 400, "{body}");
    let (code, body) = status(gw, Some(&ticket), Some("me"), &query).await?;
    assert_eq!(code, 400, "{body}");
    let (code, body) = status(gw, None, Some("me"), "").await?;
    assert_eq!(
        (code, body["error"].as_str()),
        (401, Some("missing_ticket")),
        "{body}"
    );

    // The cookie the 202 set works as the header does.
    let by_cookie = http()
        .get(format!("{gw}/api/v1/queue/status"))
        .header("cookie", format!("fs_queue_ticket={ticket}"))
        .bearer_auth(token("me"))
        .send()
        .await?;
    assert_eq!(by_cookie.status().as_u16(), 200);
    funnel.cleanup().await
}

/// Every `Set-Cookie` of a response.
fn cookies(headers: &reqwest::header::HeaderMap) -> Vec<String> {
    headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect()
}

/// The ticket cookie of joining, and the pass cookie of the admitted status.
async fn room_cookies(funnel: &Funnel) -> anyhow::Result<Vec<String>> {
    let gw = &funnel.gateway.url;
    let (code, body, headers) = order(gw, "u1", "A", "k", None).await?;
    assert_eq!(code, 202, "{body}");
    let mut all = cookies(&headers);
    let ticket = body["ticket"].as_str().unwrap_or_default().to_owned();
    let admitted = poll_until(
        "admission",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let response = http()
                .get(format!("{gw}/api/v1/queue/status"))
                .header("x-queue-ticket", &ticket)
                .bearer_auth(token("u1"))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let set = cookies(response.headers());
            let body: Value = response.json().await.map_err(|e| e.to_string())?;
            match body["admitted"].as_bool() {
                Some(true) => Ok(set),
                _ => Err(body.to_string()),
            }
        },
    )
    .await?;
    all.extend(admitted);
    Ok(all)
}

#[tokio::test]
async fn cookies_are_secure_unless_the_sale_runs_over_plain_http() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: room(100),
        ..Options::default()
    })
    .await?;
    let set = room_cookies(&funnel).await?;
    let names: Vec<&str> = set.iter().filter_map(|c| c.split('=').next()).collect();
    assert_eq!(names, ["fs_queue_ticket", "fs_queue_pass"], "{set:?}");
    for cookie in &set {
        assert!(
            cookie.contains("; HttpOnly") && cookie.ends_with("; Secure"),
            "{cookie}"
        );
    }
    funnel.cleanup().await?;

    let local = Funnel::start(Options {
        config: json!({"waitingRoom": {"enabled": true, "admitPerSecond": 100, "insecureCookies": true}}),
        ..Options::default()
    })
    .await?;
    let set = room_cookies(&local).await?;
    assert_eq!(set.len(), 2, "{set:?}");
    for cookie in &set {
        assert!(
            cookie.contains("; HttpOnly") && !cookie.contains("Secure"),
            "{cookie}"
        );
    }
    local.cleanup().await
}

/// `lease_pass` as the order route calls it: the error code, the lease, or
/// the status of the queued answer.
async fn lease(funnel: &Funnel, pass: Option<&str>) -> anyhow::Result<Result<PassLease, String>> {
    let state = &funnel.gateway.state;
    let room = state
        .waiting_room
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no waiting room"))?;
    let mut headers = HeaderMap::new();
    if let Some(pass) = pass {
        headers.insert(PASS_HEADER, HeaderValue::try_from(pass)?);
    }
    Ok(
        match lease_pass(state, room, &headers, &User("u1".into()), None).await {
            Ok(Entry::Admitted(lease)) => Ok(lease),
            Ok(Entry::Queued(answer)) => Err(format!("queued: {}", answer.status())),
            Err(refusal) => Err(refusal.code().to_owned()),
        },
    )
}

#[tokio::test]
async fn a_retry_of_an_acknowledged_order_with_its_used_pass_gets_the_order_again()
-> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: room(100),
        ..Options::default()
    })
    .await?;
    let url = &funnel.gateway.url;
    let (_, body, _) = order(url, "u1", "A", "k", None).await?;
    let ticket = body["ticket"].as_str().unwrap_or_default();
    let pass = wait_for_pass(url, ticket, Duration::from_secs(10)).await?;
    let (code, first, _) = order(url, "u1", "A", "k", Some(&pass)).await?;
    assert_eq!(code, 201, "{first}");
    // The answer was lost on the way: the buyer retries with the same key
    // and the pass the order used up, and learns its order.
    let (code, again, _) = order(url, "u1", "A", "k", Some(&pass)).await?;
    assert_eq!(
        (code, &again["orderId"]),
        (201, &first["orderId"]),
        "{again}"
    );
    // The pass buys nothing else.
    let (code, other, _) = order(url, "u1", "A", "k2", Some(&pass)).await?;
    assert_eq!(
        (code, other["error"].as_str()),
        (403, Some("replayed")),
        "{other}"
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn a_retry_with_its_used_pass_of_an_order_that_lapsed_is_told_so() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: room(100),
        reservation_ttl: Duration::from_secs(2),
        ..Options::default()
    })
    .await?;
    let url = &funnel.gateway.url;
    let (_, body, _) = order(url, "u1", "A", "k", None).await?;
    let ticket = body["ticket"].as_str().unwrap_or_default();
    let pass = wait_for_pass(url, ticket, Duration::from_secs(10)).await?;
    let (code, first, _) = order(url, "u1", "A", "k", Some(&pass)).await?;
    assert_eq!(code, 201, "{first}");
    wait_past(
        first["payBeforeMs"].as_i64().unwrap_or_default(),
        Duration::from_secs(10),
    )
    .await?;
    // Not yet swept, but no longer an order: the note of its answer is not
    // served as if it were.
    let (code, again, _) = order(url, "u1", "A", "k", Some(&pass)).await?;
    assert_eq!(
        (code, again["error"].as_str()),
        (409, Some("order_lapsed")),
        "{again}"
    );
    funnel.cleanup().await
}

#[tokio::test]
async fn a_leased_pass_is_spent_only_once_the_order_commits() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: room(100),
        ..Options::default()
    })
    .await?;
    assert_eq!(
        lease(&funnel, None).await?.err().as_deref(),
        Some("queued: 202 Accepted")
    );
    let (_, body, _) = order(&funnel.gateway.url, "u1", "A", "k", None).await?;
    let ticket = body["ticket"].as_str().unwrap_or_default();
    let pass = wait_for_pass(&funnel.gateway.url, ticket, Duration::from_secs(10)).await?;

    let held = lease(&funnel, Some(&pass))
        .await?
        .map_err(anyhow::Error::msg)?;
    assert_eq!(
        lease(&funnel, Some(&pass)).await?.err().as_deref(),
        Some("replayed")
    );
    // The client goes away: the request, and the lease with it, is dropped.
    let started = std::time::Instant::now();
    drop(held);
    let held = poll_until(
        "the pass back",
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            match lease(&funnel, Some(&pass)).await {
                Ok(Ok(lease)) => Ok(lease),
                Ok(Err(code)) => Err(code),
                Err(err) => Err(err.to_string()),
            }
        },
    )
    .await?;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "given back by the drop, not by the 5 s lease lapsing: {:?}",
        started.elapsed()
    );
    // The order succeeded: spent, here and on the order route.
    held.commit().await?;
    assert_eq!(
        lease(&funnel, Some(&pass)).await?.err().as_deref(),
        Some("replayed")
    );
    let (code, body, _) = order(&funnel.gateway.url, "u1", "A", "k2", Some(&pass)).await?;
    assert_eq!(
        (code, body["error"].as_str()),
        (403, Some("replayed")),
        "{body}"
    );
    funnel.cleanup().await
}

/// The `/queue` page as a shopper sees it, rendered by headless Chromium:
/// first the position, then (once admitted) the go-ahead.
#[tokio::test]
async fn the_queue_page_shows_the_position_then_admission() -> anyhow::Result<()> {
    let Some(chromium) = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
    else {
        anyhow::bail!("no Chromium found: install Debian's chromium (the test script does)");
    };
    // One admission per second, and three users ahead: the page opens while waiting.
    let funnel = Funnel::start(Options {
        config: room(1),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let mut ticket = String::new();
    for user in ["a1", "a2", "a3", "a4", "me"] {
        let (_, body, _) = order(gw, user, "A", "k", None).await?;
        ticket = body["ticket"].as_str().unwrap_or_default().to_owned();
    }
    // The shop hands the page the buyer's token (and here, with no cookie
    // jar, the ticket) in the fragment, which never reaches a server.
    let page = format!("{gw}/queue#ticket={ticket}&token={}", token("me"));
    let render = |budget_ms: u64| {
        let page = page.clone();
        async move {
            let output = tokio::process::Command::new(chromium)
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                ])
                .arg(format!("--virtual-time-budget={budget_ms}"))
                .args(["--dump-dom", &page])
                .kill_on_drop(true)
                .output()
                .await?;
            anyhow::Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        }
    };
    let waiting = render(500).await?;
    assert!(
        waiting.contains("data-state=\"waiting\""),
        "the page shows the queue: {waiting}"
    );
    let position = waiting
        .split("id=\"position\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_default()
        .to_owned();
    assert!(
        position.parse::<u64>().is_ok_and(|p| p >= 1),
        "a position is shown: {position:?}"
    );
    poll_until(
        "the page to show admission",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let dom = render(1500).await.map_err(|e| e.to_string())?;
            if dom.contains("data-state=\"admitted\"") && dom.contains("It is your turn") {
                Ok(())
            } else {
                Err(dom
                    .lines()
                    .find(|l| l.contains("id=\"state\""))
                    .unwrap_or_default()
                    .to_owned())
            }
        },
    )
    .await?;
    funnel.cleanup().await
}
