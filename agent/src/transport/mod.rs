//! The NATS transport: commands arrive, results and events leave.
//!
//! Five tasks share one connection, each retrying on its own so that a NATS outage
//! (or a server that is down when the agent starts) only delays them:
//! - [`commands`]: the host's commands read from its position in the fleet's command
//!   stream (kept in its log; no consumer of its own), on every bell; each command is
//!   admitted ([`auth`]), carried out by the executor, and passed only once the log
//!   holds its completion durably;
//! - [`outbox`]: the log is the outbox: every durable record goes to
//!   `capstan.v1.evt.<host>` in seq order, resuming from what JetStream acknowledged;
//! - [`results`]: behind the outbox, each command's status in the `capstan_results`
//!   bucket, so that a coordinator reads it in one get;
//! - [`rpc`], on `capstan.v1.rpc.<host>.{ping,status,intent,log}`;
//! - [`registry`]: a signed heartbeat on `capstan.v1.beat.<host>` at the fleet's pace.

pub mod auth;
pub mod commands;
pub mod outbox;
pub mod registry;
pub mod results;
pub mod rpc;

use crate::executor::Executor;
use async_nats::jetstream;
use capstan_common::nats::{self as cnats, NatsConfig, NatsError, Scope};
use capstan_common::published::{self, Publication};
use capstan_common::signing::{Policy, Signer};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument as _;

/// What the agent says about itself in heartbeats and `status` replies.
#[derive(Debug, Clone)]
pub struct HostInfo {
    pub host: String,
    pub version: String,
    pub drivers: Vec<String>,
    pub capabilities: serde_json::Value,
    /// What the outbox last saw that should not happen (see [`outbox`]).
    pub outbox_alarm: OutboxAlarm,
}

/// The outbox's alarm: `None`, or the last unexpected publish ack (a `duplicate`
/// ack: something suppressed a record). Shown as `outbox_alarm` in heartbeats and
/// `status` until the agent restarts. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct OutboxAlarm(Arc<std::sync::Mutex<Option<String>>>);

impl OutboxAlarm {
    pub fn set(&self, alarm: String) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(alarm);
    }

    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What every task needs of NATS.
#[derive(Clone)]
pub(crate) struct Link {
    /// JetStream: on per-host accounts the API under the host prefix
    /// ([`cnats::agent_context`]).
    pub js: jetstream::Context,
    /// Replicas of what this agent creates when it is the first to need it (only
    /// without per-host accounts: there the agent may create nothing).
    pub replicas: usize,
    /// `[nats] host_accounts`.
    pub host_accounts: bool,
    /// Signs everything published.
    pub key: Arc<Signer>,
    /// The heartbeat's pace: what the coordinators last said ([`registry`]).
    pub pace: Arc<watch::Sender<Duration>>,
}

impl Link {
    /// Where the host's event stream and results bucket are.
    pub fn scope(&self) -> Scope {
        if self.host_accounts {
            Scope::Host
        } else {
            Scope::Shared
        }
    }

    /// The host's event stream, and whether it takes atomic batches. On per-host
    /// accounts a handle that asks the JetStream API nothing: the coordinators make
    /// the host's streams, and a host account reaches no request that waits in the
    /// server's JetStream API queue, which every account shares (only direct gets of
    /// its own subjects and publishes). Shared: made here when missing.
    pub async fn events(&self) -> Result<(jetstream::stream::Stream<()>, bool), NatsError> {
        let atomic = match self.scope() {
            Scope::Host => cnats::atomic_publish_supported(&self.js),
            Scope::Shared => {
                cnats::evt_stream(&self.js, self.replicas, Scope::Shared)
                    .await?
                    .cached_info()
                    .config
                    .allow_atomic_publish
            }
        };
        Ok((
            self.no_info(capstan_common::nats_layout::EVT_STREAM)
                .await?,
            atomic,
        ))
    }

    /// Whether the server's "nothing on this subject" holds ([`cnats::empty_subject_trusted`]).
    pub fn empty_subject_trusted(&self) -> bool {
        cnats::empty_subject_trusted(&self.js)
    }

    /// The results bucket's stream ([`Link::events`] for why without info): puts are
    /// publishes, the progress key a direct get.
    pub async fn results(&self) -> Result<jetstream::stream::Stream<()>, NatsError> {
        if self.scope() == Scope::Shared {
            let max_age = cnats::Retention::default().commands_max_age;
            cnats::results_bucket(&self.js, max_age, self.replicas, Scope::Shared).await?;
        }
        self.no_info(&format!(
            "KV_{}",
            capstan_common::nats_layout::RESULTS_BUCKET
        ))
        .await
    }

    /// Makes no request: the only failure is a name that is not a stream's.
    async fn no_info(&self, name: &str) -> Result<jetstream::stream::Stream<()>, NatsError> {
        self.js
            .get_stream_no_info(name)
            .await
            .map_err(|e| NatsError::Setup {
                what: name.to_string(),
                source: e.into(),
            })
    }

    /// `headers` with the host's signature of `payload` as `what` (a beat).
    pub fn sign(
        &self,
        mut headers: async_nats::HeaderMap,
        what: Publication<'_>,
        payload: &[u8],
    ) -> async_nats::HeaderMap {
        headers.insert(
            published::HEADER,
            self.key.sign_publication(what, payload).as_str(),
        );
        headers
    }

    /// One signature for a batch of `what` (records, results): each payload's
    /// headers, in order, with the signature and its proof.
    pub fn sign_batch(
        &self,
        what: Publication<'_>,
        payloads: &[&[u8]],
    ) -> Vec<async_nats::HeaderMap> {
        let batch = self.key.sign_batch(what, payloads);
        batch
            .proofs
            .into_iter()
            .map(|proof| {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(published::HEADER, batch.sig.as_str());
                headers.insert(published::PROOF_HEADER, proof.as_str());
                headers
            })
            .collect()
    }
}

/// The `seq` of `m` (a record, or the results' progress) when it is this host's own
/// signed `what`, checked with its own key: what the host reads back of its own could
/// have been put there by whoever holds its NATS credentials.
pub(crate) fn own_seq(
    own: &published::HostKeys,
    what: Publication<'_>,
    m: &jetstream::message::StreamMessage,
) -> Result<Option<u64>, published::Unverified> {
    let header = |name| m.headers.get(name).map(|v| v.as_str());
    let proof = what
        .batched()
        .then(|| header(published::PROOF_HEADER))
        .flatten();
    own.verify(what, &m.payload, header(published::HEADER), proof)?;
    Ok(serde_json::from_slice::<serde_json::Value>(&m.payload)
        .ok()
        .and_then(|v| v.get("seq")?.as_u64()))
}

/// The running transport.
pub struct Transport {
    stop_commands: watch::Sender<bool>,
    stop_rest: watch::Sender<bool>,
    /// Taken when awaited: a stop may be asked for more than once.
    commands: Option<JoinHandle<()>>,
    outbox: JoinHandle<()>,
    others: Vec<JoinHandle<()>>,
    published: watch::Receiver<u64>,
    executor: Arc<Executor>,
}

/// Waits for `delay` or until `stop` turns true; returns true when stopping.
pub(crate) async fn pause(stop: &mut watch::Receiver<bool>, delay: Duration) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => false,
        _ = stop.changed() => true,
    }
}

impl Transport {
    /// Connects (in the background, retrying for ever) and starts the five tasks.
    /// `in_flight`: how many commands may be taken and not yet finished
    /// (`commands_in_flight`); `key`: the host's key, which signs what it publishes.
    pub async fn start(
        nats: &NatsConfig,
        policy: Policy,
        executor: Arc<Executor>,
        info: HostInfo,
        in_flight: usize,
        key: Arc<Signer>,
    ) -> Result<Transport, NatsError> {
        // On per-host accounts the heartbeat checks the connection at the fleet's pace
        // (`registry::probe`); the client's own pings are then only a backstop.
        let ping = if nats.host_accounts {
            registry::BACKSTOP_PING
        } else {
            cnats::PING_INTERVAL
        };
        let client = nats
            .connect_pinging(
                &format!("capstan-agent {}", info.host),
                Some(capstan_common::nats_layout::inbox_prefix(&info.host)),
                ping,
            )
            .await?;
        let link = Link {
            js: cnats::agent_context(client.clone(), nats),
            replicas: nats.replicas,
            host_accounts: nats.host_accounts,
            key,
            pace: Arc::new(
                watch::channel(Duration::from_secs(
                    capstan_common::nats_layout::HEARTBEAT_SECS,
                ))
                .0,
            ),
        };
        let (stop_commands, commands_rx) = watch::channel(false);
        let (stop_rest, rest_rx) = watch::channel(false);
        let (published_tx, published) = watch::channel(0);
        // Each task keeps the caller's span (`sim-fleet` tags every host's logs).
        let commands = tokio::spawn(
            commands::run(
                link.clone(),
                Arc::clone(&executor),
                policy,
                info.host.clone(),
                in_flight,
                commands_rx,
            )
            .in_current_span(),
        );
        let outbox = tokio::spawn(
            outbox::run(
                link.clone(),
                Arc::clone(executor.log()),
                info.host.clone(),
                published_tx,
                info.outbox_alarm.clone(),
                rest_rx.clone(),
            )
            .in_current_span(),
        );
        let others = vec![
            tokio::spawn(
                results::run(
                    link.clone(),
                    Arc::clone(executor.log()),
                    info.host.clone(),
                    published.clone(),
                    rest_rx.clone(),
                )
                .in_current_span(),
            ),
            tokio::spawn(
                rpc::run(
                    client.clone(),
                    Arc::clone(&link.key),
                    Arc::clone(&executor),
                    info.clone(),
                    published.clone(),
                    rest_rx.clone(),
                )
                .in_current_span(),
            ),
            tokio::spawn(
                registry::run(
                    link,
                    Arc::clone(&executor),
                    info,
                    published.clone(),
                    rest_rx,
                )
                .in_current_span(),
            ),
        ];
        Ok(Transport {
            stop_commands,
            stop_rest,
            commands: Some(commands),
            outbox,
            others,
            published,
            executor,
        })
    }

    /// Follows the last seq `CAPSTAN_EVT` acknowledged.
    pub fn published(&self) -> watch::Receiver<u64> {
        self.published.clone()
    }

    /// Stops taking commands; those being carried out finish first.
    /// Idempotent: [`Transport::shutdown`] calls it again.
    pub async fn stop_commands(&mut self) {
        let _ = self.stop_commands.send(true);
        if let Some(task) = self.commands.take() {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "the command task failed");
            }
        }
    }

    /// Gives the outbox up to `drain` to publish every record logged so far, then
    /// stops everything. What is not published now is published on the next start.
    pub async fn shutdown(mut self, drain: Duration) {
        self.stop_commands().await;
        let last = self.executor.log().last_seq();
        let drained = tokio::time::timeout(drain, self.published.wait_for(|p| *p >= last))
            .await
            .is_ok_and(|r| r.is_ok());
        if !drained {
            tracing::warn!(
                last_seq = last,
                published = *self.published.borrow(),
                "not every record reached NATS before shutdown; the next start sends the rest"
            );
        }
        let _ = self.stop_rest.send(true);
        let _ = self.outbox.await;
        for task in self.others {
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_driver::sim::SimConfig;

    use crate::testkit::host_info as info;

    #[tokio::test]
    async fn status_and_heartbeat_carry_the_key_figures() {
        let rig = crate::testkit::Rig::new(SimConfig::default());
        rig.running_r1().await;
        let info = info();
        let last = rig.executor.log().last_seq();
        let status = rpc::answer("status", b"", &rig.executor, &info, 2);
        let beat = registry::beat(&info, &rig.executor, last, 2);
        let beat = serde_json::to_value(&beat).expect("beats serialise");
        for figures in [&status["figures"], &beat["figures"]] {
            assert_eq!(figures["published_seq"], 2, "{figures}");
            assert_eq!(figures["outbox_lag"], last - 2, "{figures}");
            assert_eq!(
                figures["commands"],
                serde_json::json!({"succeeded": 3, "failed": 0, "rejected": 0, "duplicate": 0})
            );
            assert_eq!(
                figures["workloads"],
                serde_json::json!({"running": 1, "stopped": 0, "failed": 0})
            );
        }
    }

    /// Given a host running a workload, its `status` answer and its heartbeat are what
    /// the coordinator's OpenAPI description says (`Status`, `HostBeat`): every key a
    /// listed property of the type it gives, with the driver's capabilities and the
    /// figures spelt out property by property.
    #[tokio::test]
    async fn status_and_heartbeat_are_what_the_openapi_description_says() {
        use crate::testkit::openapi;
        let rig = crate::testkit::Rig::new(SimConfig::default());
        rig.running_r1().await;
        let info = HostInfo {
            capabilities: serde_json::to_value(rig.executor.driver().capabilities()).unwrap(),
            ..info()
        };
        let last = rig.executor.log().last_seq();
        let status = rpc::answer("status", b"", &rig.executor, &info, 2);
        let beat = registry::beat(&info, &rig.executor, last, 2);
        let beat = serde_json::to_value(&beat).expect("beats serialise");
        let spec = openapi::description();
        let capabilities = openapi::schema(&spec, "Capabilities");
        let mut listed: Vec<&String> = capabilities["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        listed.sort();
        for (name, json) in [("Status", &status), ("HostBeat", &beat)] {
            if let Err(e) = openapi::allows(&spec, &openapi::schema(&spec, name), json) {
                panic!("{name}: {json}: {e}");
            }
            let mut sent: Vec<&String> = json["capabilities"].as_object().unwrap().keys().collect();
            sent.sort();
            assert_eq!(sent, listed, "{name}: the capabilities a driver declares");
            assert!(json["figures"].is_object(), "{json}");
        }
    }

    #[tokio::test]
    async fn an_outbox_alarm_shows_in_status_and_heartbeat() {
        let rig = crate::testkit::Rig::new(SimConfig::default());
        let info = info();
        let status = rpc::answer("status", b"", &rig.executor, &info, 0);
        assert_eq!(status["outbox_alarm"], serde_json::Value::Null, "{status}");
        // The outbox holds a clone of the HostInfo's alarm.
        let outbox_side = info.outbox_alarm.clone();
        outbox_side.set("record 5 was acknowledged as a duplicate".into());
        let status = rpc::answer("status", b"", &rig.executor, &info, 0);
        assert_eq!(
            status["outbox_alarm"],
            "record 5 was acknowledged as a duplicate"
        );
        let beat = registry::beat(&info, &rig.executor, 0, 0);
        let json = serde_json::to_value(&beat).expect("beats serialise");
        assert_eq!(
            json["outbox_alarm"],
            "record 5 was acknowledged as a duplicate"
        );
    }

    /// A TCP proxy on loopback to `target` that forwards both ways while `open` says
    /// true and holds everything (reads nothing, writes nothing, closes nothing) while
    /// it says false: what a partition looks like to both ends. Returns its port.
    async fn partitionable_proxy(target: u16, open: watch::Receiver<bool>) -> u16 {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        async fn pump(
            mut from: tokio::net::tcp::OwnedReadHalf,
            mut to: tokio::net::tcp::OwnedWriteHalf,
            mut open: watch::Receiver<bool>,
        ) {
            let mut buf = vec![0; 16 * 1024];
            loop {
                if open.wait_for(|o| *o).await.is_err() {
                    return;
                }
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if open.wait_for(|o| *o).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("its address").port();
        tokio::spawn(async move {
            let mut gate = open.clone();
            loop {
                // While partitioned, new connections wait in the backlog, unanswered.
                if gate.wait_for(|o| *o).await.is_err() {
                    return;
                }
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    return;
                };
                let (client_r, client_w) = client.into_split();
                let (server_r, server_w) = server.into_split();
                tokio::spawn(pump(client_r, server_w, open.clone()));
                tokio::spawn(pump(server_r, client_w, open.clone()));
            }
        });
        port
    }

    /// A client of a fresh server through a [`partitionable_proxy`] (open), pinging
    /// every `ping`; the server, and the proxy's gate.
    async fn proxied_client(
        ping: Duration,
    ) -> (
        capstan_testsupport::NatsServer,
        watch::Sender<bool>,
        async_nats::Client,
    ) {
        let server = capstan_testsupport::NatsServer::start(&[]);
        let (open, gate) = watch::channel(true);
        let port = partitionable_proxy(server.port, gate).await;
        let config = NatsConfig {
            url: format!("nats://127.0.0.1:{port}"),
            ..NatsConfig::default()
        };
        let client = config
            .connect_pinging("partition-test", None, ping)
            .await
            .expect("connect");
        (server, open, client)
    }

    /// How many times `client` has connected.
    fn connects(client: &async_nats::Client) -> u64 {
        client
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until `client` is connected on its second connection at least.
    async fn reconnected(client: &async_nats::Client) {
        use async_nats::connection::State;
        tokio::time::timeout(Duration::from_secs(60), async {
            while client.connection_state() != State::Connected || connects(client) < 2 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("a new connection once the partition is over");
    }

    /// A partition (nothing gets through, nothing is closed) is noticed by the pings:
    /// the connection is given up and, once the network is back, replaced by a new
    /// one, instead of waiting for TCP's retransmission backoff to revive the old one.
    #[tokio::test]
    async fn a_connection_gone_silent_is_given_up_and_replaced_after_the_partition() {
        use async_nats::connection::State;
        let (_server, open, client) = proxied_client(cnats::PING_INTERVAL).await;
        client
            .flush()
            .await
            .expect("a round trip through the proxy");
        assert_eq!(connects(&client), 1);

        open.send_replace(false);
        // Bounded by far more than the ~3 pings it takes, far less than async-nats'
        // default would (3 × 60 s).
        let given_up = tokio::time::timeout(Duration::from_secs(60), async {
            while client.connection_state() == State::Connected {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(given_up.is_ok(), "the silent connection was never given up");

        open.send_replace(true);
        reconnected(&client).await;
        client
            .flush()
            .await
            .expect("a round trip on the new connection");
    }

    /// On per-host accounts the client pings only every [`registry::BACKSTOP_PING`]:
    /// the probe after each beat is what notices a partition. Given a connection
    /// through a proxy, a probe is answered (nobody listens, and the server says so
    /// at once); partitioned, it is not, and the connection, replaced, comes back
    /// once the partition is over.
    #[tokio::test]
    async fn a_probe_unanswered_replaces_the_connection_and_a_new_one_follows_the_partition() {
        use async_nats::connection::State;
        let (_server, open, client) = proxied_client(registry::BACKSTOP_PING).await;
        let subject = capstan_common::nats_layout::probe_subject("h1");
        let within = Duration::from_secs(2);
        assert!(
            !registry::probe(&client, &subject, within).await,
            "answered"
        );
        assert_eq!(connects(&client), 1);

        open.send_replace(false);
        assert!(registry::probe(&client, &subject, within).await, "silent");
        // The client's own pings (every 60 s) have not noticed.
        assert_eq!(client.connection_state(), State::Connected);
        registry::replace(&client).await;
        open.send_replace(true);
        reconnected(&client).await;
        assert!(
            !registry::probe(&client, &subject, within).await,
            "answered again"
        );
    }
}
