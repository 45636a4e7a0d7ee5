//! Unit tests of the API: the OpenAPI description against the router, the codes and
//! the answers; request parsing and command sizing.

use super::{is_json, parse_duration};
use axum::http::{header, HeaderMap, HeaderValue};
use std::time::Duration;

#[test]
fn only_json_is_json() {
    let with = |v: &'static str| {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
        is_json(&h)
    };
    assert!(with("application/json"));
    assert!(with("Application/JSON; charset=utf-8"));
    assert!(!with("text/plain"));
    assert!(!with("application/x-www-form-urlencoded"));
    assert!(!with("multipart/form-data; boundary=x"));
    assert!(!with("application/jsonp"));
    assert!(!is_json(&HeaderMap::new()));
}

/// The description names exactly the routes `router` serves, with their methods.
#[test]
fn the_openapi_description_names_every_route_and_no_other() {
    let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
    assert_eq!(spec["openapi"], "3.1.0");
    let mut described: Vec<String> = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            let ops = ops.as_object().unwrap();
            ops.keys()
                .map(move |m| format!("{} {path}", m.to_uppercase()))
        })
        .collect();
    // The routes as api.rs declares them, in its calls of `route` with a path and
    // `get` or `post`.
    let source = include_str!("../api.rs");
    // A route's methods: `get(a)`, or chained as `get(a).put(b)`.
    let mut served: Vec<String> = source
        .split(".route(\"")
        .skip(1)
        .filter_map(|rest| {
            let (path, rest) = rest.split_once('"')?;
            let call = rest.trim_start_matches(", ").split(')').collect::<Vec<_>>();
            let methods: Vec<String> = call
                .iter()
                .take_while(|part| {
                    let name = part.trim_start_matches('.').split('(').next().unwrap_or("");
                    ["get", "post", "put", "delete"].contains(&name)
                })
                .map(|part| {
                    let name = part.trim_start_matches('.').split('(').next().unwrap_or("");
                    format!("{} {path}", name.to_uppercase())
                })
                .collect();
            Some(methods)
        })
        .flatten()
        .collect();
    described.sort();
    served.sort();
    assert_eq!(described, served);
    assert!(served.len() >= 10, "{served:?}");
}

/// Every operation has an operationId, camelCase and its own (what a generated
/// client names its methods by), and the server listed is the default `listen`.
#[test]
fn the_operations_have_their_own_camel_case_ids_and_the_server_is_the_default() {
    let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
    let mut ids = Vec::new();
    for (path, ops) in spec["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}: no operationId"));
            let camel = id.starts_with(|c: char| c.is_ascii_lowercase())
                && id.chars().all(|c| c.is_ascii_alphanumeric())
                && id.chars().any(|c| c.is_ascii_uppercase());
            assert!(camel, "{method} {path}: {id} is not camelCase of words");
            ids.push(id.to_string());
        }
    }
    let count = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), count, "an operationId used twice: {ids:?}");
    let url = format!("http://{}", crate::config::default_listen());
    assert_eq!(spec["servers"][0]["url"], url.as_str());
}

/// `Spec.image` carries the image grammar the server enforces: the pattern and
/// length `validate::is_image_ref` is held to (in common's tests).
#[test]
fn the_described_image_pattern_is_the_validators() {
    use capstan_common::validate::{IMAGE_REF_MAX_LEN, IMAGE_REF_PATTERN};
    let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
    let image = &spec["components"]["schemas"]["Spec"]["properties"]["image"];
    assert_eq!(image["pattern"], IMAGE_REF_PATTERN);
    assert_eq!(image["maxLength"], IMAGE_REF_MAX_LEN);
}

/// The `enum` of a schema of the description, as strings.
fn described_enum(pointer: &str) -> Vec<String> {
    let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
    spec.pointer(pointer)
        .and_then(|v| v.as_array())
        .unwrap_or_else(|| panic!("no enum at {pointer}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// `ApiError`'s `error.code` lists exactly the codes an error answer can carry:
/// every protocol code (a command the fleet refused answers with its own) and
/// every code of this API's (what `ApiError` is built from: [`ApiCode`] or
/// [`ErrorCode`], nothing else); `ErrorCode` lists the protocol's.
#[test]
fn the_described_error_codes_are_every_code_an_answer_can_carry() {
    use super::ApiCode;
    use capstan_common::ErrorCode;
    use std::collections::BTreeSet;
    let protocol: BTreeSet<String> = ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    let mut every = protocol.clone();
    every.extend(ApiCode::ALL.iter().map(|c| c.as_str().to_string()));
    for (pointer, codes) in [
        (
            "/components/schemas/ApiError/properties/error/properties/code/enum",
            &every,
        ),
        ("/components/schemas/ErrorCode/enum", &protocol),
    ] {
        let described = described_enum(pointer);
        let set: BTreeSet<String> = described.iter().cloned().collect();
        let missing: Vec<_> = codes.difference(&set).collect();
        let unknown: Vec<_> = set.difference(codes).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "{pointer}: missing {missing:?}, no such code {unknown:?}"
        );
        assert_eq!(described.len(), set.len(), "{pointer}: a code listed twice");
    }
}

/// `CommandStatus` in the description is what `status::summarize` writes (the
/// agent's result entries, answered as they are): its `status` values, and an
/// `error` whose fields are the described ones, `code` an `ErrorCode`, `retryable`
/// a boolean.
#[test]
fn the_described_command_status_is_what_summarize_writes() {
    use capstan_common::status::summarize;
    use serde_json::json;
    let spec: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
    let schema = &spec["components"]["schemas"]["CommandStatus"];
    let statuses = described_enum("/components/schemas/CommandStatus/properties/status/enum");
    assert_eq!(schema["properties"]["status"]["type"], "string");
    let error = schema["properties"]["error"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["type"] == "object")
        .expect("an object form of error");
    assert_eq!(
        error["properties"]["code"]["$ref"],
        "#/components/schemas/ErrorCode"
    );
    assert_eq!(error["properties"]["retryable"]["type"], "boolean");
    let codes = described_enum("/components/schemas/ErrorCode/enum");
    for (code, outcome) in [
        ("hook_failed", "failed"),
        ("namespace_not_found", "failed"),
        ("expired", "rejected"),
    ] {
        let events = vec![
            json!({"seq": 1, "kind": "command_received", "command_id": "a"}),
            json!({"seq": 2, "kind": "command_completed", "command_id": "a",
                "outcome": outcome, "code": code, "message": "m"}),
        ];
        let status = serde_json::to_value(summarize("a", "h1", events)).unwrap();
        assert!(
            statuses.iter().any(|s| status["status"] == s.as_str()),
            "{status}"
        );
        for key in schema["required"].as_array().unwrap() {
            assert!(
                status.get(key.as_str().unwrap()).is_some(),
                "{key}: {status}"
            );
        }
        let answered = status["error"].as_object().unwrap();
        for key in error["required"].as_array().unwrap() {
            assert!(answered.contains_key(key.as_str().unwrap()), "{key}");
        }
        for key in answered.keys() {
            assert!(
                error["properties"].get(key).is_some(),
                "`{key}` undescribed"
            );
        }
        assert!(codes.iter().any(|c| answered["code"] == c.as_str()));
        assert!(answered["retryable"].is_boolean());
    }
}

/// Every code an agent answers is passed on under the same code, but
/// `unknown_verb` (this API asks agents only verbs they know): `host_error` then.
#[test]
fn an_agents_codes_are_this_apis_but_unknown_verb() {
    use capstan_common::answers::AgentCode;
    let body = |code: &str| capstan_common::answers::ErrorBody {
        code: code.into(),
        message: "m".into(),
    };
    for code in AgentCode::ALL {
        let passed = super::hosts::agent_code(&body(code.as_str())).map(|c| c.as_str());
        match code {
            AgentCode::UnknownVerb => assert_eq!(passed, None),
            _ => assert_eq!(passed, Some(code.as_str())),
        }
    }
    assert_eq!(super::hosts::agent_code(&body("a_newer_agents_code")), None);
}

/// `ApiCode::ALL` lists every variant once, as `as_str` spells it: serde's derive
/// sees the enum itself and names every variant in its "expected one of" list.
#[test]
fn api_code_all_lists_every_code_of_the_enum() {
    use super::ApiCode;
    let refused = serde_json::from_str::<ApiCode>("\"no_such_code\"").unwrap_err();
    let message = refused.to_string();
    let (_, expected) = message
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("{message}"));
    let declared: Vec<&str> = expected
        .split(", ")
        .map(|v| v.trim_matches('`').split('`').next().unwrap())
        .collect();
    let listed: Vec<&str> = ApiCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(
        listed, declared,
        "ApiCode::ALL is not the enum's variants in order"
    );
    for code in ApiCode::ALL {
        assert_eq!(ApiCode::parse(code.as_str()), Some(code));
    }
}

/// Given bodies with and without the fields the fleet fills in, when sized, then
/// the size is never less than what the fleet signs and publishes for them, and at
/// most 9 bytes more; a body that is no command has none.
#[test]
fn the_signed_size_of_a_body_bounds_what_the_fleet_publishes() {
    use capstan_common::signing::Signer;
    let signer = Signer::generate().unwrap();
    let ports: Vec<serde_json::Value> = (1..=50)
        .map(|p| serde_json::json!({"container_port": p}))
        .collect();
    for body in [
        serde_json::json!({"host": "h1", "op": "ensure_namespace", "namespace": "ns"}),
        serde_json::json!({"v": 1, "id": "mine", "issued_at": "2026-11-29T10:00:00+01:00",
            "host": "h1", "op": "prepare_revision", "namespace": "ns", "workload": "w",
            "revision": "r1", "spec": {"driver": "sim", "ports": ports}, "sig": "ab"}),
    ] {
        let size = super::commands::signed_size(&body).unwrap();
        // As the fleet fills it in: a fresh id, the time now.
        let mut filled = body.clone();
        let object = filled.as_object_mut().unwrap();
        object.remove("sig");
        object.entry("v").or_insert(1.into());
        object.entry("id").or_insert("c-0123456789abcdef".into());
        object
            .entry("issued_at")
            .or_insert(serde_json::json!(chrono::Utc::now()));
        let command = capstan_common::Command::parse(&filled.to_string()).unwrap();
        let published = signer.signed_json(&command).len();
        assert!(
            (published..=published + 9).contains(&size),
            "{size} for {published}"
        );
    }
    assert_eq!(super::commands::signed_size(&serde_json::json!([1])), None);
    assert_eq!(
        super::commands::signed_size(&serde_json::json!({"op": "reboot"})),
        None
    );
}

#[test]
fn durations() {
    assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
    assert_eq!(parse_duration("15"), Some(Duration::from_secs(15)));
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("soon"), None);
    assert_eq!(parse_duration("5h"), None);
}
