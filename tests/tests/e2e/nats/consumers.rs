//! A fleet past a thousand hosts: every host's agent has its durable consumer on
//! `CAPSTAN_CMD`, and nats-server 2.12 and later cap a stream that sets no limit of
//! its own at 1,000 consumers (`default_max_consumers`). The 1,001st host of a fleet
//! never took a command (`maximum consumers limit reached`), found by a 2,000-host
//! run of `capstan-bench --only fleet`. The stream now sets
//! [`CMD_MAX_CONSUMERS`], when made and when a coordinator migrates one an earlier
//! release made.

use async_nats::jetstream::{self, consumer::pull, stream};
use capstan_common::nats::CMD_MAX_CONSUMERS;
use capstan_common::nats_layout;
use capstan_tests::nats::{runtime, Coordinator, Keys, NatsServer};
use futures::StreamExt as _;

/// More hosts than nats-server's default cap.
const HOSTS: usize = 1_001;

/// A durable consumer for each of [`HOSTS`] hosts, as each host's agent makes its
/// own (`agent-<host>`, its subject, explicit acks), 32 at a time.
async fn consumer_for_every_host(js: &jetstream::Context) {
    let stream = js
        .get_stream(nats_layout::CMD_STREAM)
        .await
        .expect("CAPSTAN_CMD");
    let made: Vec<Result<(), String>> = futures::stream::iter(0..HOSTS)
        .map(|i| {
            let stream = stream.clone();
            async move {
                let host = format!("h{i:04}");
                let name = nats_layout::consumer_name(&host);
                stream
                    .get_or_create_consumer(
                        &name,
                        pull::Config {
                            durable_name: Some(name.clone()),
                            filter_subject: nats_layout::cmd_subject(&host),
                            ack_policy: jetstream::consumer::AckPolicy::Explicit,
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("{host}: {e}"))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let refused: Vec<&String> = made.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "{} of {HOSTS} hosts got no consumer, e.g. {}",
        refused.len(),
        refused[0]
    );
}

async fn limit(js: &jetstream::Context) -> i32 {
    let mut stream = js
        .get_stream(nats_layout::CMD_STREAM)
        .await
        .expect("CAPSTAN_CMD");
    stream.info().await.expect("info").config.max_consumers
}

#[test]
fn the_command_stream_takes_a_consumer_for_each_of_more_than_a_thousand_hosts() {
    let server = NatsServer::start();
    runtime().block_on(async {
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = jetstream::new(client);
        capstan_common::nats::cmd_stream(&js, 1)
            .await
            .expect("CAPSTAN_CMD");
        assert_eq!(limit(&js).await, CMD_MAX_CONSUMERS);
        consumer_for_every_host(&js).await;
    });
}

#[test]
fn a_command_stream_an_earlier_release_made_is_given_the_consumer_limit() {
    let server = NatsServer::start();
    let rt = runtime();
    let (js, version) = rt.block_on(async {
        let client = async_nats::connect(server.url()).await.expect("connect");
        let version = client.server_info().version;
        let js = jetstream::new(client);
        // CAPSTAN_CMD as releases before the limit made it: none set.
        js.create_stream(stream::Config {
            name: nats_layout::CMD_STREAM.into(),
            subjects: vec!["capstan.v1.cmd.*".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: std::time::Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("the old CAPSTAN_CMD");
        (js, version)
    });
    // A coordinator migrates the layout on its first request (the harness asks
    // `capstan hosts` until it answers).
    let keys = Keys::generate();
    let coordinator = Coordinator::start(&server.url(), &keys, "");
    rt.block_on(async {
        let changeable = {
            let mut parts = version
                .split(['.', '-'])
                .map(|p| p.parse::<u64>().unwrap_or(0));
            (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (2, 12)
        };
        if changeable {
            assert_eq!(
                limit(&js).await,
                CMD_MAX_CONSUMERS,
                "nats-server {version}; the coordinator's log:\n{}",
                coordinator.log()
            );
            consumer_for_every_host(&js).await;
        } else {
            // Before 2.12 the limit cannot change, and there is no default cap.
            assert_eq!(limit(&js).await, -1, "nats-server {version}");
        }
    });
    coordinator.stop();
}
