//! The coordinator's HTTP surface beyond the CLI: health, metrics, JSON errors with
//! proper status codes (401 without the token), and the host registry's `gone` once a
//! host stops beating.

use super::Fleet;
use capstan_tests::nats::runtime;
use serde_json::Value;

/// An HTTP client whose every request (connect to last body byte) is bounded.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(capstan_tests::READY)
        .build()
        .expect("HTTP client")
}

async fn get(url: &str, token: &str) -> (u16, String) {
    let r = client()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("GET");
    (r.status().as_u16(), r.text().await.expect("body"))
}

fn code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[test]
fn health_metrics_and_json_errors() {
    let fleet = Fleet::start();
    let coordinator = &fleet.coordinator;
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();
    coordinator.run_all(&[h1.commands("shop").ensure_namespace("ns")]);
    let base = coordinator.url.clone();
    let token = coordinator.token.clone();
    runtime().block_on(async {
        let (status, body) = get(&format!("{base}/v1/hosts"), "capstan_wrong").await;
        assert_eq!((status, code(&body)), (401, "unauthorized".into()));
        let mut capstan = std::process::Command::new(capstan_tests::binary("capstan"));
        capstan
            .args(["--coordinator", &base, "hosts"])
            .env("CAPSTAN_TOKEN", "capstan_wrong")
            .env_remove("CAPSTAN_TOKEN_FILE");
        let out = capstan_tests::process::output(
            "capstan hosts (a wrong token)",
            capstan_tests::READY,
            capstan,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no valid API token (401"), "{stderr}");
        let (status, body) = get(&format!("{base}/healthz"), "").await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = get(&format!("{base}/metrics"), "").await;
        assert_eq!(status, 200);
        assert!(
            body.contains("capstan_coordinator_commands_submitted_total 1"),
            "{body}"
        );
        assert!(
            body.contains("capstan_coordinator_nats_connected 1"),
            "{body}"
        );
        assert!(
            body.contains("capstan_coordinator_http_requests_total{status=\"202\"} 1"),
            "{body}"
        );

        let client = client();
        let post = |body: &'static str| {
            let client = client.clone();
            let url = format!("{base}/v1/commands");
            let token = token.clone();
            async move {
                let r = client
                    .post(url)
                    .bearer_auth(token)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("POST");
                (r.status().as_u16(), r.text().await.expect("body"))
            }
        };
        let (status, body) = post("{nope").await;
        assert_eq!((status, code(&body)), (400, "invalid_json".into()));
        let (status, body) = post(r#"{"host":"h1","op":"reboot"}"#).await;
        assert_eq!((status, code(&body)), (400, "unknown_op".into()));
        let (status, body) =
            post(r#"{"host":"h1","op":"ensure_namespace","namespace":"Bad_NS"}"#).await;
        assert_eq!((status, code(&body)), (400, "invalid_name".into()));

        for (path, want, want_code) in [
            ("/v1/commands/unknown", 404, "command_not_found"),
            ("/v1/commands/bad%20id", 400, "invalid_id"),
            ("/v1/commands/ns/wait?timeout=soon", 400, "invalid_request"),
            ("/v1/hosts/H1.%3E/intent", 400, "invalid_name"),
            ("/v1/hosts/h9/intent", 503, "host_unreachable"),
            ("/v1/hosts/h9/verify", 503, "host_unreachable"),
            ("/v1/hosts/H1.%3E/verify", 400, "invalid_name"),
            ("/v1/hosts/h1/events?since=x", 400, "invalid_request"),
            ("/v2/anything", 404, "not_found"),
        ] {
            let (status, body) = get(&format!("{base}{path}"), &token).await;
            assert_eq!(
                (status, code(&body)),
                (want, want_code.to_string()),
                "{path}: {body}"
            );
        }
        let (status, body) = get(&format!("{base}/v1/hosts/h1/events?since=2"), &token).await;
        assert_eq!(status, 200);
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["events"].as_array().map(Vec::len), Some(1), "{body}");
        assert_eq!(v["events"][0]["seq"], 3);
        // The outbox may lag the log: what it published so far is the host's log.
        let (status, body) = get(&format!("{base}/v1/hosts/h1/verify"), &token).await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(
            (&v["host"], &v["result"]),
            (&"h1".into(), &"ok".into()),
            "{body}"
        );
        assert_eq!(v["compared"], v["published_seq"], "{body}");
        assert_eq!(v["first_difference"], Value::Null, "{body}");
    });
    daemon.stop();
    fleet.stop();
}

#[test]
fn a_host_that_stops_beating_is_gone() {
    let fleet = Fleet::start_with(None, "stale_after_secs = 1\nhosts_max_age_secs = 2", "");
    let coordinator = &fleet.coordinator;
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();
    coordinator.run_all(&[h1.commands("shop").ensure_namespace("ns")]);
    coordinator.wait_for_hosts("h1 alive", |v| v["hosts"][0]["status"] == "alive");
    daemon.stop();
    let v = coordinator.wait_for_hosts("h1 gone", |v| v["hosts"][0]["status"] == "gone");
    assert_eq!(v["hosts"][0]["host"], "h1");
    assert!(v["hosts"][0]["beat"].is_null());
    fleet.stop();
}
