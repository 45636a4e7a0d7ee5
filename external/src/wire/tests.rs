use super::*;
use crate::client::conn_hello_for_tests as hello;
use crate::client::ConnectError;
use capstan_driver::sim::{SimConfig, SimDriver};
use std::sync::Arc;
use tokio::io::BufReader;

#[test]
fn an_unknown_capability_is_ignored_and_a_missing_one_is_false() {
    let line = br#"{"hello":{"protocol":1,"kind":"sim","capabilities":{"reports_exits":true,"teleports":true}}}"#;
    let hello: DriverHello = parse_hello(line).unwrap().unwrap();
    assert_eq!(
        Capabilities::from(hello.capabilities),
        Capabilities {
            manages_lifecycle: false,
            reports_exits: true,
            restarts_exits: false,
            reaps_orphans: false,
            probes: false,
        }
    );
    // No capabilities object at all: every one is false.
    let bare: DriverHello = parse_hello(br#"{"hello":{"protocol":1,"kind":"sim"}}"#)
        .unwrap()
        .unwrap();
    assert_eq!(bare.capabilities, WireCapabilities::default());
}

#[test]
fn malformed_requests_are_rejected_with_a_reason() {
    for (line, says) in [
        (&b"not json"[..], "not a JSON object"),
        (b"[1,2]", "a JSON object"),
        (br#"{"op":"observe"}"#, "`id`"),
        (br#"{"id":-1,"op":"observe"}"#, "`id`"),
    ] {
        let err = parse_request(line).unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
    let (id, op) = parse_request(br#"{"id":7,"op":"teleport"}"#).unwrap();
    let refused = op.unwrap_err();
    assert_eq!((id, refused.error_code()), (7, ErrorCode::UnknownOp));
    let (_, op) = parse_request(br#"{"id":8,"op":"stop","namespace":"ns"}"#).unwrap();
    let refused = op.unwrap_err();
    assert_eq!(refused.error_code(), ErrorCode::InvalidCommand);
    assert!(refused.message.contains("workload"), "{}", refused.message);
    let err = Reply::parse(br#"{"id":1}"#).unwrap_err();
    assert!(
        matches!(err, WireError::Malformed(ref why) if why.contains("`ok`, `error` or `exit`")),
        "{err}"
    );
}

#[test]
fn requests_and_replies_round_trip_as_documented() {
    let op = Op::Activate {
        rev: Rev {
            namespace: "ns".into(),
            workload: "web".into(),
            revision: "r2".into(),
        },
        spec: serde_json::from_str(r#"{"driver":"sim"}"#).unwrap(),
        launch_env: [("TOKEN".to_string(), "t".to_string())].into(),
        previous: Some("r1".into()),
    };
    let line = request_line(3, &op);
    let value: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(value["op"], "activate");
    assert_eq!(value["workload"], "web");
    assert_eq!(value["previous"], "r1");
    assert_eq!(parse_request(line.as_bytes()).unwrap(), (3, Ok(op)));
    let exit = Reply::Exit(
        4,
        WireExit {
            rev: Rev {
                namespace: "ns".into(),
                workload: "web".into(),
                revision: "r2".into(),
            },
            exit_code: Some(3),
        },
    );
    assert_eq!(Reply::parse(exit.line().as_bytes()).unwrap(), exit);
    let failed = Reply::Error(5, ErrorBody::new(ErrorCode::BackendMissing, "gone"));
    assert_eq!(Reply::parse(failed.line().as_bytes()).unwrap(), failed);
    // A code from a newer driver reads as driver_failed.
    let newer = ErrorBody {
        code: "quota_exceeded".into(),
        message: "m".into(),
    };
    assert_eq!(newer.error_code(), ErrorCode::DriverFailed);

    let probe = Op::Probe {
        rev: Rev {
            namespace: "ns".into(),
            workload: "web".into(),
            revision: "r2".into(),
        },
        check: serde_json::from_str(r#"{"http":{"port":8080,"path":"/healthz"}}"#).unwrap(),
        timeout_ms: 500,
    };
    let line = request_line(6, &probe);
    let value: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(value["op"], "probe");
    assert_eq!(value["check"]["http"]["port"], 8080);
    assert_eq!(value["timeout_ms"], 500);
    assert_eq!(parse_request(line.as_bytes()).unwrap(), (6, Ok(probe)));
    let not: WireProbe = serde_json::from_str(r#"{"ready":false,"reason":"503"}"#).unwrap();
    assert_eq!(Probe::from(not), Probe::NotReady("503".into()));
    let ready: WireProbe = serde_json::from_str(r#"{"ready":true}"#).unwrap();
    assert_eq!(Probe::from(ready), Probe::Ready);
}

#[tokio::test]
async fn a_line_over_the_limit_is_refused() {
    let mut long = vec![b'x'; MAX_LINE + 1];
    long.push(b'\n');
    let mut reader = BufReader::new(&long[..]);
    let mut buf = Vec::new();
    assert!(matches!(
        read_line(&mut reader, &mut buf).await,
        Err(WireError::TooLong)
    ));
    let mut exact = vec![b'x'; MAX_LINE];
    exact.extend_from_slice(b"\nnext\n");
    let mut reader = BufReader::new(&exact[..]);
    assert!(read_line(&mut reader, &mut buf).await.unwrap());
    assert_eq!(buf.len(), MAX_LINE);
    assert!(read_line(&mut reader, &mut buf).await.unwrap());
    assert_eq!(buf, b"next");
    assert!(!read_line(&mut reader, &mut buf).await.unwrap());
}

/// A server for the sim on a socket in `dir`.
fn server(dir: &std::path::Path) -> (std::path::PathBuf, tokio::task::JoinHandle<()>) {
    server_of(dir, SimConfig::default())
}

/// A server for a sim configured with `config` on a socket in `dir`.
fn server_of(
    dir: &std::path::Path,
    config: SimConfig,
) -> (std::path::PathBuf, tokio::task::JoinHandle<()>) {
    let socket = dir.join("driver.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let sim = SimDriver::open(&dir.join("host"), config).unwrap();
    let task = tokio::spawn(async move {
        crate::serve(listener, Arc::new(sim)).await.unwrap();
    });
    (socket, task)
}

#[tokio::test]
async fn a_version_nobody_shares_fails_the_hello_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, server) = server(dir.path());
    let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let (read, mut write) = stream.into_split();
    let err = hello(&mut BufReader::new(read), &mut write, &[7, 8])
        .await
        .unwrap_err();
    let ConnectError::Refused(body) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(body.error_code(), ErrorCode::UnsupportedVersion);
    assert!(err.to_string().contains("[7, 8]"), "{err}");
    // The version we speak works.
    let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let (read, mut write) = stream.into_split();
    let ours = hello(&mut BufReader::new(read), &mut write, &[1, 7])
        .await
        .unwrap();
    assert_eq!((ours.protocol, ours.kind.as_str()), (1, "sim"));
    assert!(ours.capabilities.manages_lifecycle);
    server.abort();
}

/// The sim's spec of `web` with a readiness check.
fn checked() -> capstan_common::Spec {
    serde_json::from_str(
        r#"{"driver":"sim","readiness":{"check":{"tcp":{"port":8080}},"timeout_ms":200}}"#,
    )
    .unwrap()
}

async fn client(socket: &std::path::Path) -> crate::ExternalDriver {
    let config = crate::ExternalConfig {
        socket: socket.to_path_buf(),
        ..Default::default()
    };
    crate::ExternalDriver::connect(config).await.unwrap()
}

#[tokio::test]
async fn a_driver_that_announces_probes_is_asked_over_the_wire() {
    use capstan_driver::Driver as _;
    let dir = tempfile::tempdir().unwrap();
    let (socket, server) = server(dir.path());
    let driver = client(&socket).await;
    assert!(driver.capabilities().probes, "the sim announces probes");
    let rev = RevisionRef {
        namespace: "ns",
        workload: "web",
        revision: "r1",
    };
    let spec = checked();
    let check = spec.readiness.clone().unwrap().check;
    driver.ensure_namespace("ns").await.unwrap();
    driver
        .prepare(rev, &spec)
        .await
        .expect("a spec with readiness is taken");
    let timeout = std::time::Duration::from_millis(200);
    // Prepared, not started: the driver's answer, not ready with its reason.
    let probe = driver.probe(rev, &check, timeout).await.unwrap();
    assert!(
        matches!(&probe, Probe::NotReady(why) if why.contains("does not run")),
        "{probe:?}"
    );
    driver
        .activate(rev, &spec, &LaunchEnv::new(), None)
        .await
        .unwrap();
    assert_eq!(
        driver.probe(rev, &check, timeout).await.unwrap(),
        Probe::Ready
    );
    server.abort();
}

#[tokio::test]
async fn a_driver_without_probes_gets_no_spec_with_readiness() {
    use capstan_driver::Driver as _;
    let dir = tempfile::tempdir().unwrap();
    let config = SimConfig {
        probes: false,
        ..SimConfig::default()
    };
    let (socket, server) = server_of(dir.path(), config);
    let driver = client(&socket).await;
    assert!(!driver.capabilities().probes);
    let rev = RevisionRef {
        namespace: "ns",
        workload: "web",
        revision: "r1",
    };
    driver.ensure_namespace("ns").await.unwrap();
    let refused = driver.prepare(rev, &checked()).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InvalidSpec, "{refused:?}");
    assert!(refused.report().contains("probes"), "{}", refused.report());
    server.abort();
}
