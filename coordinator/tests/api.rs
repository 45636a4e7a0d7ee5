//! The HTTP API in process, over a real nats-server (`capstan_testsupport`):
//! tokens and roles, JSON-only bodies, and ids bound to their content.

mod common;

use capstan_common::published::Publication;
use common::two_tokens;
use common::{api, beat_body, code, ns, publish_signed, registered, registered_as, signed};
use serde_json::json;
use std::sync::Arc;

#[tokio::test]
async fn tokens_and_roles_guard_every_v1_endpoint() {
    let (submit, read, tokens) = two_tokens();
    let api = api(Some(tokens)).await;
    registered_as(&api, "h1", Some(&submit)).await;
    let command = ns("c1", "h1", "shop");

    for token in [None, Some("capstan_wrong"), Some("")] {
        let (status, body) = api.get("/v1/hosts", token).await;
        assert_eq!((status, code(&body)), (401, "unauthorized"), "{body}");
        let (status, body) = api.post(token, &command).await;
        assert_eq!((status, code(&body)), (401, "unauthorized"), "{body}");
        let (status, body) = api.get("/v1/commands/c1", token).await;
        assert_eq!((status, code(&body)), (401, "unauthorized"), "{body}");
    }
    // Not a bearer token at all.
    let response = api
        .http
        .get(format!("{}/v1/hosts", api.base))
        .basic_auth("ops", Some(&submit))
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(
        response
            .headers()
            .get("www-authenticate")
            .map(|v| v.as_bytes()),
        Some(&b"Bearer"[..])
    );

    // The scheme is case-insensitive (RFC 9110); the token is not.
    let lower = api
        .http
        .get(format!("{}/v1/hosts", api.base))
        .header("authorization", format!("bearer {read}"))
        .send()
        .await
        .expect("GET");
    assert_eq!(lower.status().as_u16(), 200);
    let (status, _) = api.get("/v1/hosts", Some(&read.to_uppercase())).await;
    assert_eq!(status, 401);

    // A read token reads, and may not submit.
    let (status, body) = api.get("/v1/hosts", Some(&read)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api.post(Some(&read), &command).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, body) = api.get("/v1/commands/c1", Some(&read)).await;
    assert_eq!(
        (status, code(&body)),
        (404, "command_not_found"),
        "a forbidden submission publishes nothing: {body}"
    );

    // A submit token does both.
    let (status, body) = api.post(Some(&submit), &command).await;
    assert_eq!((status, body["id"].as_str()), (202, Some("c1")), "{body}");
    let (status, body) = api.get("/v1/commands/c1", Some(&submit)).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("pending")));
    let (status, body) = api.get("/v1/commands/c1", Some(&read)).await;
    assert_eq!(status, 200, "{body}");

    // Health and metrics stay open.
    assert_eq!(api.get("/healthz", None).await.0, 200);
    assert_eq!(api.get("/metrics", None).await.0, 200);
}

#[tokio::test]
async fn only_json_bodies_are_accepted() {
    let (submit, _, tokens) = two_tokens();
    let api = api(Some(tokens)).await;
    registered_as(&api, "h1", Some(&submit)).await;
    let body = ns("c1", "h1", "shop").to_string();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let (status, reply) = api
            .send(
                reqwest::Method::POST,
                "/v1/commands",
                Some(&submit),
                content_type,
                &body,
            )
            .await;
        assert_eq!(
            (status, code(&reply)),
            (415, "unsupported_media_type"),
            "{content_type:?}: {reply}"
        );
    }
    let (status, reply) = api.get("/v1/commands/c1", Some(&submit)).await;
    assert_eq!(
        (status, code(&reply)),
        (404, "command_not_found"),
        "{reply}"
    );
    let json = Some("application/json; charset=utf-8");
    let (status, reply) = api
        .send(
            reqwest::Method::POST,
            "/v1/commands",
            Some(&submit),
            json,
            &body,
        )
        .await;
    assert_eq!(status, 202, "{reply}");
}

#[tokio::test]
async fn without_tokens_a_loopback_api_is_open_but_still_json_only() {
    let api = api(None).await;
    registered(&api, "h1").await;
    let (status, body) = api.get("/v1/hosts", None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            "/v1/commands",
            None,
            Some("text/plain"),
            &ns("c1", "h1", "shop").to_string(),
        )
        .await;
    assert_eq!((status, code(&body)), (415, "unsupported_media_type"));
    let (status, body) = api.post(None, &ns("c1", "h1", "shop")).await;
    assert_eq!(status, 202, "{body}");
}

#[tokio::test]
async fn an_id_is_bound_to_its_content() {
    let (submit, _, tokens) = two_tokens();
    let api = api(Some(tokens)).await;
    for host in ["h1", "h2"] {
        registered_as(&api, host, Some(&submit)).await;
    }
    let token = Some(submit.as_str());
    let first = ns("c1", "h1", "shop");
    assert_eq!(api.post(token, &first).await.0, 202);

    // The same content again, with an issued_at of its own: an idempotent re-publish.
    let mut again = first.clone();
    again["issued_at"] = json!("2026-11-30T12:00:00Z");
    let (status, body) = api.post(token, &again).await;
    assert_eq!((status, body["host"].as_str()), (202, Some("h1")), "{body}");

    for other in [
        ns("c1", "h2", "shop"),
        ns("c1", "h1", "other"),
        json!({"id": "c1", "host": "h1", "op": "delete_namespace", "namespace": "shop"}),
    ] {
        let (status, body) = api.post(token, &other).await;
        assert_eq!(
            (status, code(&body)),
            (409, "id_conflict"),
            "{other}: {body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("c1"),
            "{body}"
        );
    }
    // The id still names the first command.
    let (status, body) = api.get("/v1/commands/c1", token).await;
    assert_eq!((status, body["host"].as_str()), (200, Some("h1")), "{body}");
}

#[tokio::test]
async fn the_client_says_plainly_when_the_token_is_missing_or_too_weak() {
    use capstan_coordinator::client::{Client, ClientError};
    let (submit, read, tokens) = two_tokens();
    let api = api(Some(tokens)).await;
    registered_as(&api, "h1", Some(&submit)).await;
    let command = ns("c1", "h1", "shop");

    let err = Client::new(&api.base, None)
        .get("/v1/hosts")
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("401") && text.contains("--token-file") && text.contains("CAPSTAN_TOKEN"),
        "{text}"
    );

    let reader = Client::new(&api.base, Some(read));
    assert!(reader.get("/v1/hosts").await.is_ok());
    let err = reader.post("/v1/commands", &command).await.unwrap_err();
    assert!(matches!(err, ClientError::Forbidden { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("403") && text.contains("`submit` token"),
        "{text}"
    );

    let accepted = Client::new(&api.base, Some(submit))
        .post("/v1/commands", &command)
        .await
        .expect("a submit token submits");
    assert_eq!(accepted["id"], "c1");
}

/// A failed flush shows in the fleet's metrics: a host whose beat says its log takes no
/// writes is counted, without naming it.
#[tokio::test]
async fn metrics_count_hosts_by_status_and_the_unhealthy_ones() {
    let api = api(None).await;
    for (host, healthy) in [("h1", true), ("h2", false)] {
        api.beat(host, healthy).await;
    }
    let text = api
        .http
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    assert!(
        text.contains("capstan_coordinator_hosts{status=\"alive\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("capstan_coordinator_hosts_unhealthy 1\n"),
        "{text}"
    );
    assert!(!text.contains("h2"), "no host names: {text}");
}

/// Hosts heard are listed once each with their latest beat; a host registered but
/// not heard yet is `warming` (the coordinator has listened for less than
/// `stale_after`), never `gone`; a beat replayed after a later one (whoever holds the
/// host's NATS credentials can send it again) is refused and counted, and the later
/// one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_list_keeps_each_hosts_latest_beat_and_refuses_a_replayed_one() {
    let api = api(None).await;
    let hosts: Vec<String> = (0..20).map(|i| format!("h{i:03}")).collect();
    for host in &hosts {
        api.beat(host, true).await;
    }
    registered(&api, "silent").await;
    // h000 beats again; then its first beat comes back.
    let key = registered(&api, "h000").await;
    // Beats closer than MIN_GAP are dropped unchecked: each waits it out.
    let gap = capstan_coordinator::fleet::liveness::MIN_GAP;
    tokio::time::sleep(gap).await;
    let first = beat_body("h000", true);
    api.send_beat("h000", &key, &first).await;
    let first_at: capstan_common::answers::HostBeat = serde_json::from_slice(&first).unwrap();
    api.heard("h000", first_at.at).await;
    tokio::time::sleep(gap).await;
    let later = beat_body("h000", false);
    api.send_beat("h000", &key, &later).await;
    let later_at: capstan_common::answers::HostBeat = serde_json::from_slice(&later).unwrap();
    api.heard("h000", later_at.at).await;
    tokio::time::sleep(gap).await;
    api.send_beat("h000", &key, &first).await;
    let replayed = || {
        api.state
            .fleet
            .beat_receipts()
            .into_iter()
            .find(|(outcome, _)| *outcome == "replayed")
            .map(|(_, n)| n)
    };
    for _ in 0..1000 {
        if replayed() == Some(1) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(replayed(), Some(1), "{:?}", api.state.fleet.beat_receipts());
    let (status, v) = api.get("/v1/hosts", None).await;
    assert_eq!(status, 200, "{v}");
    let listed: Vec<(&str, &str)> = v["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| (h["host"].as_str().unwrap(), h["status"].as_str().unwrap()))
        .collect();
    let mut expected: Vec<(&str, &str)> = hosts.iter().map(|h| (h.as_str(), "alive")).collect();
    expected.push(("silent", "warming"));
    assert_eq!(listed, expected, "{v}");
    assert_eq!(
        v["hosts"][0]["beat"]["healthy"],
        json!(false),
        "the later beat stays: {v}"
    );
    assert_eq!(
        (&v["beat_secs"], &v["stale_after_secs"]),
        (&json!(5), &json!(15))
    );
}

/// Seen once on a busy machine: the main job printed an empty audit log as the truth.
/// async-nats' no-wait fetch can end a batch early on a loaded server; a read must
/// then retry or fail (503 `nats_error`), never answer with fewer records. Here a
/// host's 1,000 records are read by 24 concurrent readers, 4 times each, while other
/// hosts publish as fast as they can.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_of_a_hosts_records_under_load_are_whole_or_refused() {
    const RECORDS: u64 = 1000;
    let api = Arc::new(api(None).await);
    // The first read sets the streams up (and finds nothing yet).
    let (status, first) = api.get("/v1/hosts/h1/events", None).await;
    assert_eq!(status, 200, "{first}");
    let client = async_nats::connect(&api.nats.url).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let subject = capstan_common::nats_layout::evt_subject("h1");
    let key = registered(&api, "h1").await;
    let mut acks = Vec::new();
    for seq in 1..=RECORDS {
        let record = json!({"seq": seq, "kind": "namespace_ready", "namespace": "ns"});
        let body = record.to_string().into_bytes();
        let ack = js
            .publish_with_headers(
                subject.clone(),
                signed(&key, Publication::Record, &body),
                body.into(),
            )
            .await
            .expect("publish");
        acks.push(ack);
    }
    for ack in acks {
        ack.await.expect("stored");
    }

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (2..6)
        .map(|h| {
            let (js, stop) = (js.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let subject = capstan_common::nats_layout::evt_subject(&format!("h{h}"));
                let mut seq = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    seq += 1;
                    let record =
                        json!({"seq": seq, "kind": "namespace_ready", "pad": "x".repeat(512)});
                    // Not awaiting the ack: as much load as the client can make.
                    if js
                        .publish(subject.clone(), record.to_string().into())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                seq
            })
        })
        .collect();
    let readers: Vec<_> = (0..24)
        .map(|_| {
            let api = Arc::clone(&api);
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for _ in 0..4 {
                    let (status, body) = api.get("/v1/hosts/h1/events?limit=1000", None).await;
                    let count = body["events"].as_array().map(Vec::len);
                    answers.push((status, count, code(&body).to_string()));
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for reader in readers {
        answers.extend(reader.await.expect("reader"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut published = 0;
    for task in load {
        published += task.await.expect("load");
    }
    let whole = answers
        .iter()
        .filter(|(status, count, _)| *status == 200 && *count == Some(RECORDS as usize))
        .count();
    let refused = answers
        .iter()
        .filter(|(status, _, code)| *status == 503 && code == "nats_error")
        .count();
    println!(
        "{} reads under load ({published} records published meanwhile): {whole} whole, {refused} refused",
        answers.len()
    );
    assert_eq!(
        whole + refused,
        answers.len(),
        "a read answered with fewer records: {:?}",
        answers
            .iter()
            .filter(|(s, c, _)| !(*s == 200 && *c == Some(RECORDS as usize)))
            .collect::<Vec<_>>()
    );
    assert!(whole > 0, "no read got through: {answers:?}");
}

/// `CAPSTAN_COMMANDS` bounds each host's commands: past the limit that host's oldest
/// goes (limits retention: commands are kept by limits, not acked away, so refusing
/// the next would stop a busy host for good), and another host's stay.
#[tokio::test]
async fn one_hosts_commands_are_bounded_and_other_hosts_keep_theirs() {
    let api = api(None).await;
    for host in ["busy", "h2"] {
        registered(&api, host).await;
    }
    let (status, body) = api.post(None, &ns("theirs", "h2", "c")).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = api.post(None, &ns("first", "busy", "a")).await;
    assert_eq!(status, 202, "{body}");
    // The rest straight onto its subject (as fast as JetStream takes them).
    let js = async_nats::jetstream::new(async_nats::connect(&api.nats.url).await.expect("connect"));
    let limit = capstan_common::nats::CMD_MAX_PER_HOST;
    let mut acks = Vec::new();
    for n in 1..limit {
        let ack = js
            .publish("capstan.v1.cmd.busy", format!("{n}").into())
            .await
            .expect("publish");
        acks.push(ack);
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await.expect("stored");
            }
        }
    }
    for ack in acks {
        ack.await.expect("stored");
    }
    let (status, body) = api.post(None, &ns("over", "busy", "b")).await;
    assert_eq!(status, 202, "past the limit the oldest goes: {body}");
    let stream = js
        .get_stream(capstan_common::nats_layout::CMD_STREAM)
        .await
        .expect("stream");
    assert_eq!(stream.cached_info().state.messages, limit as u64 + 1);
    let oldest = stream
        .get_first_raw_message_by_subject("capstan.v1.cmd.busy", 1)
        .await
        .expect("the host's oldest kept command");
    assert_eq!(&oldest.payload[..], b"1", "the first command went");
    let theirs = stream
        .get_first_raw_message_by_subject("capstan.v1.cmd.h2", 1)
        .await
        .expect("h2's command is kept");
    assert!(String::from_utf8_lossy(&theirs.payload).contains("theirs"));
}

/// A batch's signature is checked once and remembered; unregistering the key that
/// signed it must make its records unverified again, not leave them taken from memory.
#[tokio::test]
async fn records_signed_by_an_unregistered_key_are_refused_even_when_checked_before() {
    let api = api(None).await;
    let (status, first) = api.get("/v1/hosts/h1/events", None).await;
    assert_eq!(status, 200, "{first}");
    let js = async_nats::jetstream::new(async_nats::connect(&api.nats.url).await.expect("connect"));
    let subject = capstan_common::nats_layout::evt_subject("h1");
    let old = registered(&api, "h1").await;
    let body = json!({"seq": 1, "kind": "namespace_ready", "namespace": "ns"})
        .to_string()
        .into_bytes();
    publish_signed(&js, subject, &old, Publication::Record, body).await;
    let (status, body) = api.get("/v1/hosts/h1/events", None).await;
    assert_eq!(
        status, 200,
        "checked (and remembered) while its key is registered: {body}"
    );

    // The host is re-keyed: a new key registered, the old one removed.
    let new = capstan_common::signing::Signer::generate().expect("key");
    let put = json!({"public_key": new.public_hex()}).to_string();
    let path = "/v1/hosts/h1/keys";
    let (status, body) = api
        .send(
            reqwest::Method::PUT,
            path,
            None,
            Some("application/json"),
            &put,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let path = format!("/v1/hosts/h1/keys/{}", old.public_hex());
    let (status, body) = api
        .send(reqwest::Method::DELETE, &path, None, None, "")
        .await;
    assert_eq!(status, 200, "{body}");

    // Once the coordinator's copy has the change (the watch's lag, waited on), the
    // record is refused; a coordinator that took it from memory answers 200 for ever.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, body) = api.get("/v1/hosts/h1/events", None).await;
        if (status, code(&body)) == (502, "unverified") {
            break;
        }
        assert_eq!(status, 200, "{body}");
        assert!(
            std::time::Instant::now() < deadline,
            "still taken 30 s after its key was unregistered: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A command for a host nobody registered (a misspelt name) is refused at once, not
/// queued for days; asked to, it is queued for a host being provisioned; once the
/// host's key is registered, its commands are taken.
#[tokio::test]
async fn a_command_for_a_host_nobody_registered_is_refused_unless_queued() {
    let api = api(None).await;
    let (status, body) = api.post(None, &ns("c1", "ghost", "shop")).await;
    assert_eq!((status, code(&body)), (404, "host_not_found"), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ghost") && message.contains("unknown_host=queue"),
        "{message}"
    );
    let (status, body) = api.get("/v1/commands/c1", None).await;
    assert_eq!(
        (status, code(&body)),
        (404, "command_not_found"),
        "nothing was recorded: {body}"
    );

    let json = Some("application/json");
    let body = ns("c1", "ghost", "shop").to_string();
    let post = |query: &'static str| {
        let (api, body) = (&api, body.clone());
        async move {
            let path = format!("/v1/commands{query}");
            api.send(reqwest::Method::POST, &path, None, json, &body)
                .await
        }
    };
    let (status, body) = post("?unknown_host=maybe").await;
    assert_eq!((status, code(&body)), (400, "invalid_request"), "{body}");
    let (status, body) = post("?unknown_host=refuse").await;
    assert_eq!((status, code(&body)), (404, "host_not_found"), "{body}");
    let (status, body) = post("?unknown_host=queue").await;
    assert_eq!((status, body["id"].as_str()), (202, Some("c1")), "{body}");
    let (status, body) = api.get("/v1/commands/c1", None).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("pending")));

    registered(&api, "ghost").await;
    let (status, body) = api.post(None, &ns("c2", "ghost", "shop")).await;
    assert_eq!(status, 202, "{body}");
}

/// A result that left its events out (`events_truncated`) is answered with every one
/// of its records read from the host's stream (in bounded pages), or not at all: a
/// result whose records are not all there any more is 502 `result_unreadable`, never
/// 200 with the ones found.
#[tokio::test]
async fn a_truncated_result_is_answered_whole_or_refused_never_in_part() {
    const RECORDS: u64 = 300;
    let api = api(None).await;
    let key = registered(&api, "h1").await;
    let (status, body) = api.post(None, &ns("big", "h1", "shop")).await;
    assert_eq!(status, 202, "{body}");
    let js = async_nats::jetstream::new(async_nats::connect(&api.nats.url).await.expect("connect"));
    let subject = capstan_common::nats_layout::evt_subject("h1");
    for seq in 1..=RECORDS {
        // Every other record is another command's: read, not kept.
        let id = if seq % 2 == 0 { "big" } else { "other" };
        let record = json!({"seq": seq, "kind": "namespace_ready", "command_id": id,
            "pad": "x".repeat(2000)});
        let body = record.to_string().into_bytes();
        publish_signed(&js, subject.clone(), &key, Publication::Record, body).await;
    }
    let result = |last: u64| {
        json!({"id": "big", "host": "h1", "status": "succeeded", "done": true,
            "error": null, "events": [], "events_truncated": true,
            "first_seq": 1, "last_seq": last})
        .to_string()
        .into_bytes()
    };
    let entry = capstan_common::nats_layout::result_subject("h1", "big");
    publish_signed(
        &js,
        entry.clone(),
        &key,
        Publication::Result,
        result(RECORDS),
    )
    .await;
    let (status, body) = api.get("/v1/commands/big", None).await;
    assert_eq!(status, 200, "{body:.300}");
    let seqs: Vec<u64> = body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    assert_eq!(seqs, (2..=RECORDS).step_by(2).collect::<Vec<_>>());
    assert!(body.get("events_truncated").is_none(), "{body:.300}");

    // Records 301..=400 are not in the stream (aged out, say): what is there is not
    // the whole.
    publish_signed(&js, entry, &key, Publication::Result, result(RECORDS + 100)).await;
    let (status, body) = api.get("/v1/commands/big", None).await;
    assert_eq!(
        (status, code(&body)),
        (502, "result_unreadable"),
        "{body:.300}"
    );
}
