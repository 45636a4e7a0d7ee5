//! What the coordinator passes on from a host's agent (`/v1/hosts/{host}/intent`,
//! `/status`, `/log`), over a real nats-server, with the host's RPC answered by this
//! test as a host would (signed by its registered key): an answer is passed on only
//! when it is what the verb gives, as it came; an error answer is the API's error.

mod common;

use capstan_common::published::{self, Publication};
use common::{api, code, registered};
use futures::StreamExt as _;
use serde_json::{json, Value};

/// Answers `capstan.v1.rpc.<host>.<verb>` with `answers[verb]`, signed by `host`'s
/// registered key, until the test ends.
async fn answer_as_host(api: &common::Api, host: &str, answers: Value) {
    let key = registered(api, host).await;
    let client = async_nats::connect(&api.nats.url).await.expect("connect");
    let mut requests = client
        .subscribe(format!("capstan.v1.rpc.{host}.*"))
        .await
        .expect("subscribe");
    let probe = client.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let verb = request.subject.rsplit('.').next().unwrap_or_default();
            let body = answers[verb].to_string().into_bytes();
            // Bound to the request's nonce, as an agent signs.
            let nonce = request
                .headers
                .as_ref()
                .and_then(|h| h.get(published::NONCE_HEADER))
                .map(|v| v.as_str());
            let what = Publication::Answer {
                subject: request.subject.as_str(),
                nonce: published::nonce_of(nonce),
            };
            let headers = common::signed(&key, what, &body);
            let reply = request.reply.expect("a request");
            client
                .publish_with_headers(reply, headers, body.into())
                .await
                .expect("reply");
        }
    });
    // Ready once a request through the server is answered (a flush does not wait for
    // the server to have taken the subscription).
    probe
        .request(format!("capstan.v1.rpc.{host}.ping"), "".into())
        .await
        .expect("the test's host answers");
}

fn intent() -> Value {
    json!({"applied_seq": 3, "namespaces": {"shop": {"ready_seq": 1}},
        "workloads": {"shop/web": {"intent": "running", "active_revision": "r1",
            "revisions": {"r1": "active"}, "failed": null}},
        "in_flight": {}, "grants": {"namespaces": {}, "revisions": {}},
        "from_a_newer_agent": true})
}

/// Given a host whose agent answers `intent` with an intent (and a field this build
/// does not know), `status` with an error answer and `log` with something that is no
/// `log` answer, when the API is asked for each, then the intent is passed on as it
/// came, the error is the API's (502, under the agent's code) and the malformed answer
/// is `host_error` (502) — not a 200 carrying an error or a broken body (what the API
/// answered before it read each answer as its type).
#[tokio::test]
async fn a_hosts_answer_is_passed_on_only_when_it_is_what_the_verb_gives() {
    let api = api(None).await;
    let answers = json!({
        "intent": intent(),
        "status": {"error": {"code": "log_unreadable", "message": "disk gone"}},
        "log": {"records": "not a list", "last_seq": 3},
    });
    answer_as_host(&api, "h1", answers).await;

    let (status, body) = api.get("/v1/hosts/h1/intent", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, intent(), "passed on as it came");

    let (status, body) = api.get("/v1/hosts/h1/status", None).await;
    assert_eq!((status, code(&body)), (502, "log_unreadable"), "{body}");
    assert_eq!(body["error"]["message"], "disk gone");

    let (status, body) = api.get("/v1/hosts/h1/log", None).await;
    assert_eq!((status, code(&body)), (502, "host_error"), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("`log` answer"), "{message}");
}

/// An error code of a newer agent's, which this build does not know, is `host_error`
/// naming it; an intent missing what every intent has is `host_error` too.
#[tokio::test]
async fn an_unknown_code_or_an_incomplete_intent_is_host_error() {
    let api = api(None).await;
    let answers = json!({
        "status": {"error": {"code": "a_newer_code", "message": "m"}},
        "intent": {"applied_seq": 3},
    });
    answer_as_host(&api, "h2", answers).await;

    let (status, body) = api.get("/v1/hosts/h2/status", None).await;
    assert_eq!((status, code(&body)), (502, "host_error"), "{body}");
    assert_eq!(body["error"]["message"], "a_newer_code: m");

    let (status, body) = api.get("/v1/hosts/h2/intent", None).await;
    assert_eq!((status, code(&body)), (502, "host_error"), "{body}");
}
