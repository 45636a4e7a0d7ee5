//! The HTTP API's edges, over a real nats-server: the size limit held on what is
//! signed, not on the body; `Host` checked on a coordinator without tokens; `/metrics`
//! reading the registry once however many scrape; waits and stream reads bounded.

mod common;

use capstan_coordinator::client::Client;
use capstan_coordinator::guard::{Bound, Limits};
use capstan_coordinator::metrics::Metrics;
use common::{api, api_with, code, ns, registered, two_tokens, Api};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A sim `prepare_revision` with `ports` ports, each given as its container port
/// only: compact as sent, about three times longer in its canonical form (every
/// field of every port spelled out).
fn prepare_with_ports(id: &str, ports: u16) -> Value {
    let ports: Vec<Value> = (1..=ports).map(|p| json!({"container_port": p})).collect();
    json!({"id": id, "host": "h1", "op": "prepare_revision", "namespace": "ns",
        "workload": "web", "revision": "r1", "spec": {"driver": "sim", "ports": ports}})
}

/// How many commands `CAPSTAN_COMMANDS` holds for host `h1`.
async fn published_to_h1(api: &Api) -> u64 {
    let client = async_nats::connect(&api.nats.url).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream(capstan_common::nats_layout::CMD_STREAM)
        .await
        .expect("the command stream");
    let subject = capstan_common::nats_layout::cmd_subject("h1");
    let info = stream
        .info_with_subjects(subject.clone())
        .await
        .expect("stream info");
    use futures::StreamExt as _;
    let counts: Vec<_> = info.collect().await;
    counts
        .into_iter()
        .map(|c| c.expect("a subject count"))
        .filter(|(s, _)| *s == subject)
        .map(|(_, n)| n as u64)
        .sum()
}

#[tokio::test]
async fn a_body_whose_signed_form_is_over_the_limit_is_refused_at_submit() {
    let api = api(None).await;
    registered(&api, "h1").await;
    // One command first, so the streams exist to count in.
    assert_eq!(api.post(None, &ns("c0", "h1", "ns")).await.0, 202);
    let limit = capstan_common::MAX_COMMAND_BYTES;

    let big = prepare_with_ports("big", 5000);
    assert!(
        big.to_string().len() < limit / 2,
        "the body is well under the limit"
    );
    let (status, body) = api.post(None, &big).await;
    assert_eq!((status, code(&body)), (413, "too_large"), "{body:.300}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("as signed"), "{message}");
    let (status, body) = api.get("/v1/commands/big", None).await;
    assert_eq!((status, code(&body)), (404, "command_not_found"), "{body}");
    assert_eq!(published_to_h1(&api).await, 1, "nothing more was published");

    // The same command with fewer ports, under the limit as signed, goes through.
    let (status, body) = api.post(None, &prepare_with_ports("small", 3000)).await;
    assert_eq!(status, 202, "{body:.300}");
    assert_eq!(published_to_h1(&api).await, 2);
}

/// `GET path` with `Host: host` (and a token); the status and error code.
async fn with_host(api: &Api, path: &str, host: &str, token: Option<&str>) -> (u16, String) {
    let mut request = api
        .http
        .get(format!("{}{path}", api.base))
        .header(reqwest::header::HOST, host);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    (status, code(&body).to_string())
}

#[tokio::test]
async fn without_tokens_only_requests_for_a_loopback_host_are_answered() {
    let api = api(None).await;
    let port = api.base.rsplit(':').next().unwrap().to_string();
    for path in [
        "/v1/hosts",
        "/healthz",
        "/metrics",
        "/v1/openapi.json",
        "/nowhere",
    ] {
        for host in [
            format!("rebound.example:{port}"),
            "rebound.example".into(),
            "10.0.0.5".into(),
        ] {
            let answer = with_host(&api, path, &host, None).await;
            assert_eq!(
                answer,
                (403, "forbidden_host".to_string()),
                "{path} for {host}"
            );
        }
    }
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "localhost".into(),
    ] {
        assert_eq!(
            with_host(&api, "/v1/hosts", &host, None).await.0,
            200,
            "{host}"
        );
    }
    // Nothing reaches the fleet from another host name: a POST is refused as well.
    let refused = api
        .http
        .post(format!("{}/v1/commands", api.base))
        .header(reqwest::header::HOST, "rebound.example")
        .header("content-type", "application/json")
        .body(ns("c1", "h1", "ns").to_string())
        .send()
        .await
        .expect("POST");
    assert_eq!(refused.status().as_u16(), 403);
    let (status, body) = api.get("/v1/commands/c1", None).await;
    assert_eq!((status, code(&body)), (404, "command_not_found"));
}

#[tokio::test]
async fn with_tokens_any_host_is_answered_to_a_token() {
    let (_, read, tokens) = two_tokens();
    let api = api(Some(tokens)).await;
    assert_eq!(
        with_host(&api, "/v1/hosts", "coordinator.internal:443", Some(&read))
            .await
            .0,
        200
    );
    assert_eq!(
        with_host(&api, "/v1/hosts", "coordinator.internal:443", None).await,
        (401, "unauthorized".to_string())
    );
}

/// The `capstan_coordinator_hosts{status="alive"}` figure of a scrape.
fn alive(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("capstan_coordinator_hosts{status=\"alive\"} "))
        .and_then(|n| n.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_scrapes_read_the_registry_once_per_interval() {
    let api = Arc::new(api(None).await);
    for host in ["h1", "h2"] {
        api.beat(host, true).await;
    }
    let scrapes: Vec<_> = (0..40)
        .map(|_| {
            let api = Arc::clone(&api);
            tokio::spawn(async move {
                let (status, body) = api.get("/metrics", None).await;
                (status, alive(body.as_str().unwrap_or_default()))
            })
        })
        .collect();
    for scrape in scrapes {
        assert_eq!(scrape.await.expect("scrape"), (200, Some(2)));
    }
    assert_eq!(api.state.metrics.fleet.reads(), 1, "40 scrapes, one read");

    // A host that appears within the interval shows at the next read, not before.
    api.beat("h3", true).await;
    let (_, text) = api.get("/metrics", None).await;
    assert_eq!(alive(text.as_str().unwrap_or_default()), Some(2));
    assert_eq!(api.state.metrics.fleet.reads(), 1);
}

#[tokio::test]
async fn figures_are_read_again_once_the_interval_passed() {
    // An interval of zero: every scrape is past it.
    let api = api_with(
        None,
        Limits::default(),
        Metrics::with_fleet_interval(Duration::ZERO),
    )
    .await;
    for n in 1..=3 {
        assert_eq!(api.get("/metrics", None).await.0, 200);
        assert_eq!(api.state.metrics.fleet.reads(), n);
    }
}

/// Waits until `ready` holds (checking every 5 ms, for at most 30 s).
async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "waited 30 s for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many 503 answers the API counted.
fn unavailable(api: &Api) -> u64 {
    let text = api.state.metrics.render(true, None, &[]);
    text.lines()
        .find_map(|l| l.strip_prefix("capstan_coordinator_http_requests_total{status=\"503\"} "))
        .map_or(0, |n| n.parse().expect("a count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_its_bound_a_wait_or_a_stream_read_is_refused_busy_until_one_ends() {
    let api = Arc::new(api_with(None, Limits::new(2, 1), Metrics::default()).await);
    registered(&api, "h1").await;
    assert_eq!(api.post(None, &ns("c1", "h1", "ns")).await.0, 202);
    // Two waits on a command no agent will answer, held open.
    let held: Vec<_> = (0..2)
        .map(|_| {
            let api = Arc::clone(&api);
            tokio::spawn(async move { api.get("/v1/commands/c1/wait?timeout=60s", None).await })
        })
        .collect();
    until("both waits to hold their permits", || {
        api.state.limits.available(Bound::Waits) == 0
    })
    .await;
    let response = api
        .http
        .get(format!("{}/v1/commands/c1/wait?timeout=1s", api.base))
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(
        response.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(code(&body), "busy", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("max_waits"));
    // Reads of the stream are their own bound: still free.
    assert_eq!(api.get("/v1/hosts/h1/events", None).await.0, 200);

    // The CLI's client waits its turn: refused, it asks again and is answered once a
    // held wait went away.
    let client = {
        let base = api.base.clone();
        tokio::spawn(async move {
            Client::new(&base, None)
                .get("/v1/commands/c1/wait?timeout=1ms")
                .await
        })
    };
    until("the client to be refused once", || unavailable(&api) == 2).await;
    for wait in held {
        wait.abort();
    }
    let answer = client
        .await
        .expect("client")
        .expect("answered once a wait ended");
    assert_eq!(
        (answer["id"].as_str(), answer["done"].as_bool()),
        (Some("c1"), Some(false))
    );
    until("the held waits to end", || {
        api.state.limits.available(Bound::Waits) == 2
    })
    .await;

    // With the one stream read taken, events and a command's status are busy.
    let taken = api
        .state
        .limits
        .try_take(Bound::StreamReads)
        .expect("the permit");
    for path in ["/v1/hosts/h1/events", "/v1/commands/c1"] {
        let (status, body) = api.get(path, None).await;
        assert_eq!((status, code(&body)), (503, "busy"), "{path}: {body}");
    }
    drop(taken);
    assert_eq!(api.get("/v1/commands/c1", None).await.0, 200);
}
