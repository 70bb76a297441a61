//! The bot shield over HTTP: a join takes a solved challenge whose
//! difficulty follows the degradation tier, and every refused proof costs
//! Redis no write (counted against Redis's own statistics).

mod common;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use common::{Funnel, Options, Running, http, token};
use flashsale_e2e::{
    browser::Chromium, metrics::sum_samples, private_redis::PrivateRedis, wait::poll_until,
};
use gateway::{
    bot_shield::{ALGORITHM, PROOF_HEADER, work},
    server::SwitchSource,
};
use serde_json::{Value, json};

/// A waiting room admitting fast, so nobody waits and the admission script
/// writes nothing, behind a shield of `difficulty_bits` by tier.
fn shielded(difficulty_bits: &[u8], challenge_ttl_seconds: u64) -> Value {
    json!({"waitingRoom": {
        "enabled": true, "admitPerSecond": 100_000, "passTtlSeconds": 60,
        "botShield": {"difficultyBits": difficulty_bits, "challengeTtlSeconds": challenge_ttl_seconds},
    }})
}

/// A challenge for `user`: status and body.
async fn challenge(gateway: &str, user: &str) -> anyhow::Result<(u16, Value)> {
    let response = http()
        .post(format!("{gateway}/api/v1/queue/challenge"))
        .bearer_auth(token(user))
        .send()
        .await?;
    let code = response.status().as_u16();
    Ok((code, response.json().await.unwrap_or(Value::Null)))
}

/// A challenge for `user`, solved as a script solves it: `<challenge>:<solution>`.
async fn solved(gateway: &str, user: &str) -> anyhow::Result<(String, Value)> {
    let (code, body) = challenge(gateway, user).await?;
    anyhow::ensure!(code == 200, "challenge: {code} {body}");
    let token = body["challenge"].as_str().unwrap_or_default();
    let difficulty = u8::try_from(body["difficulty"].as_u64().unwrap_or(u64::MAX))?;
    let mac = work::mac_of(token).ok_or_else(|| anyhow::anyhow!("no MAC in {token}"))?;
    let (solution, _) = work::solve(&mac, difficulty);
    Ok((format!("{token}:{solution}"), body))
}

/// A join (an order without a pass) carrying `proof`: status and body.
async fn join(gateway: &str, user: &str, proof: Option<&str>) -> anyhow::Result<(u16, Value)> {
    join_as(gateway, user, proof, None).await
}

/// A join through a proxy that names the client by `fingerprint`.
async fn join_as(
    gateway: &str,
    user: &str,
    proof: Option<&str>,
    fingerprint: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    order(gateway, user, &format!("{user}-k"), proof, fingerprint).await
}

/// An order of `user` under idempotency key `key`, carrying `proof`, from
/// the client a proxy names by `fingerprint`: status and body.
async fn order(
    gateway: &str,
    user: &str,
    key: &str,
    proof: Option<&str>,
    fingerprint: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    let mut request = http()
        .post(format!("{gateway}/api/v1/orders"))
        .bearer_auth(token(user))
        .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": key}));
    if let Some(proof) = proof {
        request = request.header(PROOF_HEADER, proof);
    }
    if let Some(fingerprint) = fingerprint {
        request = request.header("x-ja4", fingerprint);
    }
    let response = request.send().await?;
    let code = response.status().as_u16();
    Ok((code, response.json().await.unwrap_or(Value::Null)))
}

/// Puts the gateway at `tier` through its degradation file, and waits
/// until it is in force.
async fn at_tier(
    funnel: &Funnel,
    file: &std::path::Path,
    tier: u32,
    generation: u64,
) -> anyhow::Result<()> {
    std::fs::write(file, switches(tier, generation)?)?;
    poll_until(
        &format!("the gateway at tier {tier}"),
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            match funnel.gateway.metric("gateway_degradation_tier") {
                Some(seen) if seen == f64::from(tier) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    Ok(())
}

/// The degradation file's data at `tier`.
fn switches(tier: u32, generation: u64) -> anyhow::Result<String> {
    let data = BTreeMap::from([
        ("tier", tier.to_string()),
        ("generation", generation.to_string()),
        ("switches", "{}".to_owned()),
        ("reason", "test".to_owned()),
        ("changedAt", jiff::Timestamp::now().to_string()),
    ]);
    Ok(serde_json::to_string(&data)?)
}

#[tokio::test]
async fn a_join_takes_a_solved_challenge_whose_difficulty_follows_the_tier() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(flashsale_e2e::stack::unique_name("gw-shield"));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("degradation.json");
    std::fs::write(&file, switches(0, 1)?)?;
    let funnel = Funnel::start(Options {
        config: shielded(&[4, 8, 12], 60),
        switches: SwitchSource::File(file.clone()),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;

    // No proof: told where to get a challenge.
    let (code, body) = join(gw, "ann", None).await?;
    assert_eq!(
        (code, body["error"].as_str()),
        (428, Some("challenge_required")),
        "{body}"
    );
    let (proof, body) = solved(gw, "ann").await?;
    assert_eq!(body["difficulty"], 4, "{body}");
    assert_eq!(body["algorithm"], ALGORITHM, "{body}");
    let (code, body) = join(gw, "ann", Some(&proof)).await?;
    assert_eq!(
        (code, body["status"].as_str()),
        (202, Some("queued")),
        "{body}"
    );

    // A challenge taken at tier 0 and spent after the tier rose to 2 is
    // judged by the 4 bits it was issued with.
    let (early, _) = solved(gw, "ben").await?;
    at_tier(&funnel, &file, 2, 2).await?;
    let (_, body) = challenge(gw, "cat").await?;
    assert_eq!(body["difficulty"], 12, "the tier's difficulty: {body}");
    let (code, _) = join(gw, "ben", Some(&early)).await?;
    assert_eq!(code, 202, "a challenge that raced the tier change");
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_bot_refusals_total{reason="missing"}"#),
        Some(1.0)
    );
    let _ = std::fs::remove_dir_all(&dir);
    funnel.cleanup().await
}

/// What the test counts of Redis's writes: its dirty counter (every change
/// to the data set) and the calls of the commands the join script and the
/// rate limiter write with unconditionally. A `SET NX` that finds its key
/// (the spent check refusing a replay) is a call but no write: the dirty
/// counter tells that one.
async fn writes(url: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut counted = BTreeMap::new();
    for section in ["persistence", "commandstats"] {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut conn)
            .await?;
        for line in info.lines() {
            if let Some(dirty) = line.strip_prefix("rdb_changes_since_last_save:") {
                counted.insert("dirty".to_owned(), dirty.trim().parse()?);
            }
            for command in ["incr", "hset", "pexpireat"] {
                let Some(stats) = line.strip_prefix(&format!("cmdstat_{command}:calls=")) else {
                    continue;
                };
                let calls = stats.split(',').next().unwrap_or_default();
                counted.insert(command.to_owned(), calls.parse()?);
            }
        }
    }
    Ok(counted)
}

/// The Redis clock (Unix ms).
async fn redis_now_ms(url: &str) -> anyhow::Result<u64> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
    Ok(secs * 1_000 + micros / 1_000)
}

/// `proof` spoiled two ways: a character of its MAC changed (forged), and
/// its solution replaced by the next number that does not do the work.
fn spoiled(proof: &str) -> anyhow::Result<(String, String)> {
    let (token, solution) = proof
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("{proof}"))?;
    let mut chars: Vec<char> = proof.chars().collect();
    let at = token.len() - 3;
    chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
    let forged = chars.into_iter().collect::<String>();
    let mac = work::mac_of(token).ok_or_else(|| anyhow::anyhow!("{token}"))?;
    let difficulty = 8;
    let unsolved = (solution.parse::<u64>()? + 1..)
        .find(|&n| !work::solves(&mac, n, difficulty))
        .unwrap_or_default();
    Ok((forged, format!("{token}:{unsolved}")))
}

/// Waits until the Redis clock passes the expiry of the challenge `body`
/// answered.
async fn expired(url: &str, body: &Value) -> anyhow::Result<()> {
    let expires_at_ms = body["expiresAtMs"].as_u64().unwrap_or_default();
    poll_until(
        "the challenge to expire",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async {
            match redis_now_ms(url).await {
                Ok(now) if now >= expires_at_ms => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn refused_proofs_are_named_and_cost_redis_no_write() -> anyhow::Result<()> {
    let redis = PrivateRedis::start(&[]).await?;
    let funnel = Funnel::start(Options {
        config: shielded(&[8], 2),
        redis_url: Some(redis.url.clone()),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let (proof, _) = solved(gw, "alice").await?;
    let (forged, unsolved) = spoiled(&proof)?;
    // Solved, then left to expire (a 2 s challenge).
    let (late, late_body) = solved(gw, "alice").await?;

    let before = writes(&redis.url).await?;
    let refused = [
        ("alice", Some(forged.as_str()), 403, "forged"),
        ("bob", Some(proof.as_str()), 403, "other_user"),
        ("alice", Some(unsolved.as_str()), 403, "unsolved"),
        ("alice", Some("not-a-proof"), 400, "malformed"),
        ("alice", None, 428, "challenge_required"),
    ];
    for (user, proof, status, error) in refused {
        let (code, body) = join(gw, user, proof).await?;
        assert_eq!(
            (code, body["error"].as_str()),
            (status, Some(error)),
            "{body}"
        );
    }
    expired(&redis.url, &late_body).await?;
    let (code, body) = join(gw, "alice", Some(&late)).await?;
    assert_eq!(
        (code, body["error"].as_str()),
        (403, Some("expired")),
        "{body}"
    );
    assert_eq!(writes(&redis.url).await?, before, "refusals wrote to Redis");

    // The control: a good proof (a fresh one: the first expired meanwhile)
    // queues alice, which writes.
    let (proof, _) = solved(gw, "alice").await?;
    let (code, body) = join(gw, "alice", Some(&proof)).await?;
    assert_eq!(code, 202, "{body}");
    let joined = writes(&redis.url).await?;
    assert!(joined["dirty"] > before["dirty"], "{before:?} → {joined:?}");

    // Her place gone (as when her ticket lapses), the spent proof is a
    // replay, refused without a write.
    let mut conn = redis::Client::open(redis.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let place = format!("fs:{{{}}}:wr:user:alice", funnel.sale);
    let removed: u64 = redis::cmd("DEL").arg(&place).query_async(&mut conn).await?;
    assert_eq!(removed, 1, "{place}");
    let before = writes(&redis.url).await?;
    let (code, body) = join(gw, "alice", Some(&proof)).await?;
    assert_eq!(
        (code, body["error"].as_str()),
        (403, Some("replayed")),
        "{body}"
    );
    assert_eq!(
        writes(&redis.url).await?,
        before,
        "the replay wrote to Redis"
    );

    for (reason, count) in [
        ("forged", 1.0),
        ("other_user", 1.0),
        ("unsolved", 1.0),
        ("malformed", 1.0),
        ("missing", 1.0),
        ("expired", 1.0),
        ("replayed", 1.0),
    ] {
        let series = format!(r#"gateway_bot_refusals_total{{reason="{reason}"}}"#);
        assert_eq!(funnel.gateway.metric(&series), Some(count), "{series}");
    }
    funnel.cleanup().await
}

/// Asserts that `answer` is the refusal `status` `error`.
fn assert_refused(answer: &(u16, Value), status: u16, error: &str) {
    let (code, body) = answer;
    assert_eq!(
        (*code, body["error"].as_str()),
        (status, Some(error)),
        "{body}"
    );
}

#[tokio::test]
async fn without_a_waiting_room_each_order_spends_a_proof_its_retry_may_spend_again()
-> anyhow::Result<()> {
    let redis = PrivateRedis::start(&[]).await?;
    let funnel = Funnel::start(Options {
        config: json!({"waitingRoom": {
            "enabled": false,
            "botShield": {"difficultyBits": [8], "challengeTtlSeconds": 5},
        }}),
        redis_url: Some(redis.url.clone()),
        // Nothing writes to Redis in the background.
        relay: false,
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    assert_refused(
        &order(gw, "ann", "first", None, None).await?,
        428,
        "challenge_required",
    );
    // A pass, genuine or not, does not stand in for the proof.
    let response = http()
        .post(format!("{gw}/api/v1/orders"))
        .bearer_auth(token("ann"))
        .header("x-queue-pass", "junk")
        .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": "first"}))
        .send()
        .await?;
    let code = response.status().as_u16();
    assert_refused(&(code, response.json().await?), 428, "challenge_required");

    let (proof, _) = solved(gw, "ann").await?;
    let (late, late_body) = solved(gw, "ann").await?;
    let (code, placed) = order(gw, "ann", "first", Some(&proof), None).await?;
    assert_eq!(code, 201, "{placed}");
    // A retry of the same order (its answer lost) spends the same proof
    // again, and finds the same order.
    let (code, again) = order(gw, "ann", "first", Some(&proof), None).await?;
    assert!(code < 300, "{code} {again}");
    assert_eq!(again["orderId"], placed["orderId"], "{again}");
    // Another order cannot, nor a late proof, and neither writes.
    let before = writes(&redis.url).await?;
    assert_refused(
        &order(gw, "ann", "second", Some(&proof), None).await?,
        403,
        "replayed",
    );
    expired(&redis.url, &late_body).await?;
    assert_refused(
        &order(gw, "ann", "third", Some(&late), None).await?,
        403,
        "expired",
    );
    assert_eq!(writes(&redis.url).await?, before, "refusals wrote to Redis");
    for (reason, count) in [("missing", 2.0), ("replayed", 1.0), ("expired", 1.0)] {
        let series = format!(r#"gateway_bot_refusals_total{{reason="{reason}"}}"#);
        assert_eq!(funnel.gateway.metric(&series), Some(count), "{series}");
    }
    funnel.cleanup().await
}

/// Two replicas race one proof, spent by two orders at once, round after
/// round: one order goes through, the other is refused as a replay, and
/// the stock shows one reservation per round.
#[tokio::test]
async fn a_proof_raced_on_two_replicas_is_spent_by_one_order() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        config: json!({"waitingRoom": {"enabled": false, "botShield": {"difficultyBits": [4]}}}),
        ..Options::default()
    })
    .await?;
    let other = Running::start(
        funnel.config.clone(),
        &funnel.inventory.url,
        &funnel.brokers,
        &funnel.topic,
        SwitchSource::None,
    )
    .await?;
    let before = funnel.available("A").await?;
    let rounds = 10;
    for round in 0..rounds {
        let user = format!("racer-{round}");
        let (proof, _) = solved(&funnel.gateway.url, &user).await?;
        let (one, two) = tokio::join!(
            order(&funnel.gateway.url, &user, "one", Some(&proof), None),
            order(&other.url, &user, "two", Some(&proof), None),
        );
        let mut outcomes = [one?, two?].map(|(code, body)| (code, body["error"].clone()));
        outcomes.sort_by_key(|(code, _)| *code);
        assert_eq!(
            outcomes,
            [(201, Value::Null), (403, json!("replayed"))],
            "round {round}"
        );
    }
    assert_eq!(before - funnel.available("A").await?, rounds);
    drop(other);
    funnel.cleanup().await
}

#[tokio::test]
async fn fifty_accounts_from_one_source_get_that_sources_budget() -> anyhow::Result<()> {
    let mut config = shielded(&[4], 60);
    config["waitingRoom"]["botShield"]["perSource"] = json!({
        "joinsPerSecond": 1, "burst": 5, "header": "x-ja4", "trustedProxies": ["127.0.0.1/32"],
    });
    let funnel = Funnel::start(Options {
        config,
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let started = Instant::now();
    let (mut queued, mut refused) = (0u64, 0u64);
    for n in 0..50 {
        let user = format!("bot-{n}");
        let (proof, _) = solved(gw, &user).await?;
        let (code, body) = join_as(gw, &user, Some(&proof), Some("t13d1516h2_script")).await?;
        match (code, body["error"].as_str()) {
            (202, _) => queued += 1,
            (429, Some("source_budget")) => refused += 1,
            other => anyhow::bail!("{n}: {other:?} {body}"),
        }
    }
    // The burst, and one more join per second the run took (rounded up).
    let budget = 5 + started.elapsed().as_secs() + 1;
    assert!(
        (5..=budget).contains(&queued),
        "{queued} of 50 accounts queued from one source, budget {budget}"
    );
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_bot_refusals_total{reason="source_budget"}"#),
        Some(refused as f64)
    );
    // Another client behind the same proxy is another source.
    let (proof, _) = solved(gw, "person").await?;
    let (code, body) = join_as(gw, "person", Some(&proof), Some("t13d1516h2_browser")).await?;
    assert_eq!(code, 202, "{body}");
    funnel.cleanup().await
}

/// The `/queue` page joins by itself at every tier: it takes a challenge,
/// solves it in a Web Worker while showing its progress, joins, and shows
/// the buyer's place. What each solve cost the browser is printed (for
/// `docs/benchmarks.md`).
#[tokio::test]
async fn the_queue_page_solves_its_challenge_and_joins_at_every_tier() -> anyhow::Result<()> {
    let chromium = Chromium::find().await?;
    let dir = std::env::temp_dir().join(flashsale_e2e::stack::unique_name("gw-shield-page"));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("degradation.json");
    std::fs::write(&file, switches(0, 1)?)?;
    let mut config = shielded(&[8, 12, 16], 60);
    // Plain HTTP on loopback: the ticket cookie must not need TLS.
    config["waitingRoom"]["insecureCookies"] = json!(true);
    let funnel = Funnel::start(Options {
        config,
        switches: SwitchSource::File(file.clone()),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    for (tier, bits) in [(0u32, 8u64), (1, 12), (2, 16)] {
        at_tier(&funnel, &file, tier, u64::from(tier) + 1).await?;
        // The shop hands the page the buyer's token in the fragment; no
        // ticket: the page joins by itself.
        let url = format!("{gw}/queue#token={}", token(&format!("page-{tier}")));
        let page = tokio::sync::Mutex::new(chromium.open(&url).await?);
        let state = r#"[document.getElementById("state").dataset.state, document.getElementById("detail").textContent]"#;
        poll_until(
            &format!("the page to join at tier {tier}"),
            Duration::from_secs(60),
            Duration::from_millis(50),
            || async {
                let seen = page
                    .lock()
                    .await
                    .eval(state)
                    .await
                    .map_err(|e| e.to_string())?;
                match seen[0].as_str() {
                    Some("waiting" | "admitted") => Ok(()),
                    _ => Err(seen.to_string()),
                }
            },
        )
        .await?;
        let work = page
            .lock()
            .await
            .eval(r#"({...document.getElementById("work").dataset, progress: document.getElementById("work").value})"#)
            .await?;
        let number = |field: &str| work[field].as_str().and_then(|v| v.parse::<u64>().ok());
        assert_eq!(
            number("difficulty"),
            Some(bits),
            "the tier's difficulty: {work}"
        );
        assert_eq!(work["progress"], 100, "the progress bar ends full: {work}");
        let (hashes, solve_ms) = (number("hashes"), number("solveMs"));
        assert!(hashes.is_some_and(|h| h >= 1), "{work}");
        eprintln!(
            "tier {tier}: {bits} bits, {} hashes in {} ms in the browser's worker",
            hashes.unwrap_or_default(),
            solve_ms.unwrap_or_default()
        );
    }
    // No page ever sent a join the shield refused.
    let refusals = sum_samples(&funnel.gateway.metrics(), "gateway_bot_refusals_total", "");
    assert_eq!(refusals, 0.0, "{}", funnel.gateway.metrics());
    let _ = std::fs::remove_dir_all(&dir);
    funnel.cleanup().await
}

/// Under the gateway's Redis ACL user (the rules of `inventory redis-acl`)
/// the shield spends its proofs and charges its sources: both key families
/// are the gateway's.
#[tokio::test]
async fn the_shield_spends_and_charges_as_the_gateways_acl_user() -> anyhow::Result<()> {
    let mut config = shielded(&[4], 60);
    config["waitingRoom"]["botShield"]["perSource"] = json!({"joinsPerSecond": 5, "burst": 5});
    let funnel = Funnel::start(Options {
        acl: true,
        config,
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let (proof, _) = solved(gw, "ida").await?;
    let (code, body) = join(gw, "ida", Some(&proof)).await?;
    assert_eq!(code, 202, "{body}");
    let mut admin = redis::Client::open(flashsale_e2e::stack::redis_url()?)?
        .get_multiplexed_async_connection()
        .await?;
    let pattern = |kind: &str| format!("fs:{{{}}}:{kind}:*", funnel.sale);
    let spent: Vec<String> = redis::cmd("KEYS")
        .arg(pattern("wr:spent"))
        .query_async(&mut admin)
        .await?;
    assert_eq!(spent.len(), 1, "one proof spent: {spent:?}");
    poll_until(
        "the source's charge",
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            let text = funnel.gateway.metrics();
            let charges = |outcome: &str| {
                let label = format!(r#"quota="source",outcome="{outcome}""#);
                sum_samples(&text, "gateway_rate_limit_charges_total", &label)
            };
            let (within, failed) = (charges("within"), charges("failed"));
            if failed > 0.0 {
                Err(format!("{failed} charges failed (NOPERM?)"))
            } else if within >= 1.0 {
                Ok(())
            } else {
                Err("no charge yet".to_owned())
            }
        },
    )
    .await?;
    let sources: Vec<String> = redis::cmd("KEYS")
        .arg(pattern("src"))
        .query_async(&mut admin)
        .await?;
    assert_eq!(
        sources,
        [format!("fs:{{{}}}:src:ip:127.0.0.1", funnel.sale)]
    );
    funnel.cleanup().await
}
