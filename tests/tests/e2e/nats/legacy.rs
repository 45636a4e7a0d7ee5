//! Upgrading from a release whose command stream was a work queue (`CAPSTAN_CMD`,
//! each agent reading it through a durable consumer of its own): the first
//! coordinator of this release moves every command still queued there into
//! `CAPSTAN_COMMANDS` (consumers deleted, subjects parked, commands copied in
//! order, the old stream deleted), and the upgraded agent carries them out.

use super::Fleet;
use async_nats::jetstream::{self, consumer::pull, stream};
use capstan_common::signing::Signer;
use capstan_common::{nats_layout, Command};
use capstan_tests::command::Commands;
use capstan_tests::nats::{runtime, Coordinator, Keys, NatsServer};
use capstan_tests::{wait_until, READY};

#[test]
fn commands_queued_in_an_earlier_releases_work_queue_are_carried_out_after_the_upgrade() {
    let server = NatsServer::start();
    let keys = Keys::generate();
    let signer = Signer::from_hex(&keys.secret_hex()).expect("our key");
    let ids = ["queued-1", "queued-2", "queued-3"];
    let rt = runtime();
    rt.block_on(async {
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = jetstream::new(client);
        // CAPSTAN_CMD as an earlier release made it, with h1's consumer, and three
        // commands h1 has not taken (one in another namespace).
        let old = js
            .create_stream(stream::Config {
                name: nats_layout::LEGACY_CMD_STREAM.into(),
                subjects: vec!["capstan.v1.cmd.*".into()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                duplicate_window: std::time::Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .expect("the old CAPSTAN_CMD");
        old.create_consumer(pull::Config {
            durable_name: Some(nats_layout::consumer_name("h1")),
            filter_subject: nats_layout::cmd_subject("h1"),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("h1's consumer");
        for (i, id) in ids.iter().enumerate() {
            let ns = if i == 1 { "other" } else { "moved" };
            let line = Commands::new("h1", ns)
                .ensure_namespace(id)
                .with("issued_at", chrono::Utc::now().to_rfc3339());
            let command = Command::parse(&line.to_string()).expect("a command");
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", *id);
            js.publish_with_headers(
                nats_layout::cmd_subject("h1"),
                headers,
                signer.signed_json(&command).into(),
            )
            .await
            .expect("publish")
            .await
            .expect("stored");
        }
    });
    // The coordinator moves them when it first sets up the layout (the harness asks
    // `capstan hosts` until it answers).
    let coordinator = Coordinator::start(&server.url(), &keys, "");
    let fleet = Fleet {
        server,
        keys,
        coordinator,
        accounts: None,
    };
    rt.block_on(async {
        let client = async_nats::connect(fleet.server.url())
            .await
            .expect("connect");
        let js = jetstream::new(client);
        let gone = js.get_stream(nats_layout::LEGACY_CMD_STREAM).await;
        assert!(gone.is_err(), "the old stream is deleted once moved");
        let mut moved = js
            .get_stream(nats_layout::CMD_STREAM)
            .await
            .expect("CAPSTAN_COMMANDS");
        let info = moved.info().await.expect("info");
        assert_eq!(
            info.state.messages, 3,
            "every queued command moved: {info:?}"
        );
        assert_eq!(info.config.retention, stream::RetentionPolicy::Limits);
    });
    let h1 = fleet.agent("h1").build();
    let daemon = h1.run();
    let done = wait_until("the three moved commands carried out", READY, || {
        let completed: Vec<String> = fleet
            .coordinator
            .events("h1")
            .into_iter()
            .filter(|e| e["kind"] == "command_completed" && e["outcome"] == "succeeded")
            .filter_map(|e| e["command_id"].as_str().map(str::to_string))
            .collect();
        (completed.len() == ids.len()).then_some(completed)
    });
    let mut done = done;
    done.sort();
    assert_eq!(done, ids);
    daemon.stop();
    fleet.stop();
}
