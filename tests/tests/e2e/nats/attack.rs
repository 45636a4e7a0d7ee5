//! One host cannot touch another: an attacker holding host h1's NATS credentials (its
//! nkey, from the config `capstan-coordinator nats-config` generates) tries every way
//! into host h2 — reply subjects pointed at h2's subjects, streams and buckets,
//! direct publishes and subscriptions, listing the fleet, flooding, forging — and
//! each is refused; h2's commands still complete and `capstan verify h2` stays ok.
//! A second line of defence: what h1's credentials publish without h1's host key
//! is refused by the coordinator.

use super::Fleet;
use async_nats::jetstream;
use capstan_common::nats_layout;
use capstan_tests::agent::{Agent, AgentBuilder};
use capstan_tests::hooks::Hook;
use capstan_tests::nats::{runtime, Accounts};
use capstan_tests::{wait_until, READY};
use futures::StreamExt as _;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// h1 and h2 on per-host accounts, each storage account `quota`; both agents
/// running, h2 with one command done.
struct Victim {
    fleet: Fleet,
    h1: Agent,
    h2: Agent,
    daemons: Vec<capstan_tests::process::Process>,
}

fn victim(quota: &str) -> Victim {
    victim_with(quota, |h1| h1)
}

/// [`victim`], with h1's agent built through `h1`.
fn victim_with(quota: &str, h1: impl FnOnce(AgentBuilder) -> AgentBuilder) -> Victim {
    let fleet = Fleet::with_accounts(&["h1", "h2"], quota);
    let h1 = h1(fleet.agent("h1")).build();
    let h2 = fleet.agent("h2").build();
    let daemons = vec![h1.run(), h2.run()];
    fleet
        .coordinator
        .run_all(&[h2.commands("shop").ensure_namespace("before")]);
    fleet
        .coordinator
        .run_all(&[h1.commands("mine").ensure_namespace("mine")]);
    Victim {
        fleet,
        h1,
        h2,
        daemons,
    }
}

impl Victim {
    /// h2 runs another command, its records are all in CAPSTAN_EVT in order and
    /// signed (`capstan log`, `capstan verify`), its earlier command still reads as
    /// done, and its beat is alive and signed.
    fn h2_is_unaffected(&self, name: &str) {
        let c = &self.fleet.coordinator;
        c.run_all(&[self.h2.commands("shop").ensure_namespace(name)]);
        let before = c.cli_json(&["status", "before"], 0);
        assert_eq!(before["status"], "succeeded", "{before}");
        let applied = c.cli_json(&["intent", "h2"], 0)["applied_seq"]
            .as_u64()
            .expect("applied_seq");
        let events = wait_until("h2's records in CAPSTAN_EVT", READY, || {
            let events = c.events("h2");
            (events.last().and_then(|e| e["seq"].as_u64()) >= Some(applied)).then_some(events)
        });
        let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
        assert!(
            events.iter().all(|e| e["kind"] != "command_rejected"),
            "nothing forged reached h2's commands: {events:?}"
        );
        let verified = c.cli_json(&["verify", "h2"], 0);
        assert_eq!(verified["result"], "ok", "{verified}");
        c.wait_for_hosts("h2 alive", |v| host_status(v, "h2") == Some("alive"));
    }

    fn stop(self) {
        for d in self.daemons {
            d.stop();
        }
        self.fleet.stop();
    }

    /// Stops h1's agent: the attacker holds its credentials, not its process.
    fn stop_h1(&mut self) {
        self.daemons.remove(0).stop();
    }

    /// A client of the fleet's NATS server as `user` (a host, or `coordinator`).
    async fn connect(&self, user: &str) -> async_nats::Client {
        self.credentials(user).connect().await
    }

    /// What [`Victim::connect`] connects with, to take to another thread.
    fn credentials(&self, user: &str) -> Credentials {
        Credentials {
            user: user.to_string(),
            seed: self.fleet.accounts.as_ref().expect("accounts").seed(user),
            url: self.fleet.server.url(),
        }
    }
}

/// A user's nkey seed and the server's URL.
struct Credentials {
    user: String,
    seed: String,
    url: String,
}

impl Credentials {
    async fn connect(&self) -> async_nats::Client {
        async_nats::ConnectOptions::with_nkey(self.seed.clone())
            .custom_inbox_prefix(format!("_INBOX_{}", self.user))
            .connect(&self.url)
            .await
            .expect("connect")
    }
}

fn host_status<'a>(hosts: &'a Value, host: &str) -> Option<&'a str> {
    hosts["hosts"]
        .as_array()?
        .iter()
        .find(|h| h["host"] == host)?["status"]
        .as_str()
}

/// `work` on a thread and runtime of its own, as h1's attacker, until stopped: it is
/// handed h1's credentials and the flag [`Background::stop`] raises.
struct Background<T> {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<T>,
}

fn background<T, F>(
    h1: Credentials,
    work: impl FnOnce(Credentials, Arc<AtomicBool>) -> F + Send + 'static,
) -> Background<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let raised = stop.clone();
    let thread = std::thread::spawn(move || runtime().block_on(work(h1, raised)));
    Background { stop, thread }
}

impl<T> Background<T> {
    /// Raises the flag; what `work` returned.
    fn stop(self) -> T {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the attacker's thread")
    }
}

/// The subjects stream `name` holds, as the coordinators' account sees it (`js`).
async fn subjects(js: &jetstream::Context, name: &str) -> BTreeSet<String> {
    let stream = js.get_stream(name).await.expect("stream");
    let mut all = stream.info_with_subjects(">").await.expect("subjects");
    let mut out = BTreeSet::new();
    while let Some(s) = all.next().await {
        out.insert(s.expect("subject").0);
    }
    out
}

/// h1's last record in its own event stream, read as h1 (`attacker`).
async fn last_record(attacker: &jetstream::Context) -> jetstream::message::StreamMessage {
    // No stream info: a host may not ask the JetStream API queue anything.
    let stream = attacker
        .get_stream_no_info("CAPSTAN_EVT")
        .await
        .expect("own stream");
    stream
        .direct_get_last_for_subject("capstan.v1.evt.h1")
        .await
        .expect("h1's last record")
}

/// The hex form of a command id in a key.
fn hex(id: &str) -> String {
    capstan_common::signing::to_hex(id.as_bytes())
}

#[test]
fn replies_h1_names_land_in_its_own_account_never_in_h2s_subjects_streams_or_buckets() {
    let v = victim("64M");
    let theirs = hex("before");
    runtime().block_on(async {
        let fleet_js = jetstream::new(v.connect("coordinator").await);
        let commands_before = subjects(&fleet_js, "KV_capstan_commands").await;
        let attacker = v.connect("h1").await;
        let prefix = nats_layout::HOST_API_PREFIX;
        // Requests h1 may make; each answer goes wherever the reply says.
        let requests = [
            format!("{prefix}.DIRECT.GET.CAPSTAN_EVT.capstan.v1.evt.h1"),
            format!("{prefix}.DIRECT.GET.KV_capstan_results.$KV.capstan_results.h1._progress"),
            // Its sync request: the coordinators answer it.
            nats_layout::sync_subject("h1"),
        ];
        let targets = [
            "capstan.v1.evt.h2".to_string(),
            "capstan.v1.beat.h2".into(),
            "capstan.v1.beat.madeup".into(),
            format!("$KV.capstan_results.h2.{theirs}"),
            "$KV.capstan_results.h2._progress".into(),
            format!("capstan.v1.res.h2.{theirs}"),
            "capstan.v1.cmd.h2".into(),
            "capstan.v1.cmd.madeup".into(),
            format!("$KV.capstan_commands.{}", hex("forged")),
            "capstan.v1.rpc.h2.status".into(),
            "capstan.v1.sync.h2".into(),
            "$JS.API.STREAM.PURGE.CAPSTAN_COMMANDS".into(),
            "$JS.API.STREAM.DELETE.KV_capstan_host_keys".into(),
            "$JS.API.CONSUMER.DELETE.CAPSTAN_COMMANDS.agent-h2".into(),
            "capstan.store.h2.API.STREAM.PURGE.CAPSTAN_EVT".into(),
            "capstan.store.h2.API.STREAM.DELETE.KV_capstan_results".into(),
            "$JS.API.STREAM.CREATE.EVIL".into(),
        ];
        for request in &requests {
            for target in &targets {
                attacker
                    .publish_with_reply(request.clone(), target.clone(), "".into())
                    .await
                    .expect("publish");
            }
        }
        attacker.flush().await.expect("flush");
        // Whatever the answers did is done once the same requests, asked properly,
        // have been answered (the server answers in order).
        for request in &requests {
            attacker
                .request(request.clone(), "".into())
                .await
                .expect("h1's own requests are answered");
        }
        // The fleet's account: the command stream holds no forged subject and has
        // no consumer, the registry only the two hosts, no binding was written,
        // every stream is there.
        let cmd = subjects(&fleet_js, "CAPSTAN_COMMANDS").await;
        assert!(
            cmd.iter()
                .all(|s| s == "capstan.v1.cmd.h1" || s == "capstan.v1.cmd.h2"),
            "{cmd:?}"
        );
        let keys = subjects(&fleet_js, "KV_capstan_host_keys").await;
        assert_eq!(
            keys,
            BTreeSet::from([
                "$KV.capstan_host_keys.h1".into(),
                "$KV.capstan_host_keys.h2".into()
            ])
        );
        assert_eq!(
            subjects(&fleet_js, "KV_capstan_commands").await,
            commands_before
        );
        let cmd_stream = fleet_js
            .get_stream("CAPSTAN_COMMANDS")
            .await
            .expect("stream");
        let consumers: Vec<String> = cmd_stream
            .consumer_names()
            .map(|n| n.expect("a consumer name"))
            .collect()
            .await;
        assert_eq!(
            consumers,
            Vec::<String>::new(),
            "no consumer on the command stream"
        );
        let evil = fleet_js.get_stream("EVIL").await.map(|_| ());
        assert!(
            matches!(
                &evil,
                Err(e) if matches!(
                    e.kind(),
                    jetstream::context::GetStreamErrorKind::JetStream(js)
                        if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                )
            ),
            "no stream EVIL was made: {evil:?}"
        );
        // The storage shard h1 and h2 share: their records and results only, on
        // their own subjects (what landed on h2's own, if anything, h2_is_unaffected
        // finds: its records in order and signed, its result as it was).
        let store = jetstream::with_prefix(
            v.connect("coordinator-hosts").await,
            &nats_layout::store_api_prefix("h2"),
        );
        let evt = subjects(&store, "CAPSTAN_EVT").await;
        assert_eq!(
            evt,
            BTreeSet::from(["capstan.v1.evt.h1".to_string(), "capstan.v1.evt.h2".into()])
        );
        let results = subjects(&store, "KV_capstan_results").await;
        assert!(
            results
                .iter()
                .all(|s| s.starts_with("$KV.capstan_results.h2.")
                    || s.starts_with("$KV.capstan_results.h1.")),
            "{results:?}"
        );
    });
    v.h2_is_unaffected("after-replies");
    v.stop();
}

/// h1 and h2 share a storage shard (one event stream, one results bucket): the direct
/// gets h1 may make — of its own last record, of its own progress — asked with a
/// body naming another sequence, another subject, a batch or many subjects, answer
/// nothing of h2's.
#[test]
fn h1_reads_nothing_of_h2s_from_the_shard_they_share() {
    let v = victim("64M");
    runtime().block_on(async {
        let store = jetstream::with_prefix(
            v.connect("coordinator-hosts").await,
            &nats_layout::store_api_prefix("h2"),
        );
        let last = |name: &'static str| {
            let store = store.clone();
            async move {
                let mut stream = store.get_stream(name).await.expect("stream");
                stream.info().await.expect("info").state.last_sequence
            }
        };
        let (evt_last, results_last) =
            (last("CAPSTAN_EVT").await, last("KV_capstan_results").await);
        assert!(evt_last > 0 && results_last > 0);
        let attacker = v.connect("h1").await;
        let prefix = nats_layout::HOST_API_PREFIX;
        let own = [
            (
                format!("{prefix}.DIRECT.GET.CAPSTAN_EVT.capstan.v1.evt.h1"),
                "capstan.v1.evt.",
                evt_last,
            ),
            (
                format!("{prefix}.DIRECT.GET.KV_capstan_results.$KV.capstan_results.h1._progress"),
                "$KV.capstan_results.",
                results_last,
            ),
        ];
        let mut answered = 0;
        for (request, family, last) in &own {
            let mut bodies: Vec<String> = (1..=*last)
                .map(|seq| format!("{{\"seq\":{seq}}}"))
                .collect();
            for h2 in ["capstan.v1.evt.h2", "$KV.capstan_results.h2.>", ">"] {
                bodies.push(format!("{{\"last_by_subj\":\"{h2}\"}}"));
                bodies.push(format!("{{\"next_by_subj\":\"{h2}\",\"seq\":1}}"));
                bodies.push(format!("{{\"multi_last\":[\"{h2}\"],\"batch\":100}}"));
                bodies.push(format!("{{\"next_by_subj\":\"{h2}\",\"batch\":100}}"));
            }
            for body in bodies {
                let answer = tokio::time::timeout(
                    Duration::from_secs(10),
                    attacker.request(request.clone(), body.clone().into()),
                )
                .await
                .expect("an answer or a refusal, at once");
                let Ok(message) = answer else { continue };
                let subject = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Subject"))
                    .map(|s| s.to_string());
                if let Some(subject) = subject {
                    answered += 1;
                    assert!(
                        subject.starts_with(family) && !subject.contains("h2"),
                        "{request} {body}: answered {subject}"
                    );
                }
            }
        }
        // What is answered at all is h1's own (2.15 refuses a body on this endpoint
        // with 408; an answer, if any, is the last message on the subject named).
        eprintln!("{answered} direct gets answered, each with h1's own");
    });
    v.h2_is_unaffected("after-reads");
    v.stop();
}

#[test]
fn h1_can_neither_publish_nor_hear_anything_of_h2s_nor_list_the_fleet() {
    let v = victim("64M");
    let theirs = hex("before");
    runtime().block_on(async {
        let attacker = v.connect("h1").await;
        // JetStream publishes on h2's subjects, and on subjects nobody has: nothing
        // answers, nothing is stored.
        for subject in [
            "capstan.v1.evt.h2".to_string(),
            "capstan.v1.beat.h2".into(),
            "capstan.v1.beat.madeup".into(),
            format!("$KV.capstan_results.h2.{theirs}"),
            "capstan.v1.cmd.h2".into(),
            "capstan.v1.cmd.madeup".into(),
            "capstan.v1.sync.h2".into(),
            "capstan.v1.sync.madeup".into(),
            format!("$KV.capstan_commands.{}", hex("forged")),
            "capstan.v1.rpc.h2.intent".into(),
        ] {
            let answer = tokio::time::timeout(
                Duration::from_secs(10),
                attacker.request(subject.clone(), "{\"seq\":1}".into()),
            )
            .await
            .expect("an answer or a refusal, at once");
            assert!(
                matches!(&answer, Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders),
                "{subject}: {answer:?}"
            );
        }
        // The fleet's and h2's streams cannot be listed or read: no responders for
        // what is not imported, "not enabled" for h1's own account's API.
        for (subject, body) in [
            ("capstan.js.API.STREAM.INFO.CAPSTAN_COMMANDS", r#"{"subjects_filter":">"}"#),
            ("capstan.js.API.STREAM.INFO.KV_capstan_host_keys", r#"{"subjects_filter":">"}"#),
            ("capstan.js.API.STREAM.LIST", "{}"),
            ("capstan.store.h2.API.STREAM.INFO.CAPSTAN_EVT", "{}"),
            // Not even its own streams' info: every STREAM.* request waits in the
            // server's one JetStream API queue (a flood of them had the coordinators'
            // requests dropped).
            ("capstan.js.API.STREAM.INFO.CAPSTAN_EVT", r#"{"subjects_filter":">"}"#),
            ("capstan.js.API.STREAM.INFO.KV_capstan_results", "{}"),
            ("capstan.js.API.DIRECT.GET.CAPSTAN_EVT.capstan.v1.evt.h2", ""),
            (
                "capstan.js.API.CONSUMER.CREATE.CAPSTAN_COMMANDS.steal.capstan.v1.cmd.h2",
                r#"{"stream_name":"CAPSTAN_COMMANDS","config":{"durable_name":"steal","filter_subject":"capstan.v1.cmd.h2"}}"#,
            ),
            // Not even a consumer on its own subject, of any kind (a push consumer
            // aimed at another host's inbox was how one host starved another).
            (
                "capstan.js.API.CONSUMER.CREATE.CAPSTAN_COMMANDS.agent-h1.capstan.v1.cmd.h1",
                r#"{"stream_name":"CAPSTAN_COMMANDS","config":{"durable_name":"agent-h1","filter_subject":"capstan.v1.cmd.h1","deliver_subject":"_INBOX_h2.x"}}"#,
            ),
            ("capstan.js.API.CONSUMER.MSG.NEXT.CAPSTAN_COMMANDS.agent-h2", r#"{"batch":1}"#),
            ("capstan.js.API.DIRECT.GET.CAPSTAN_COMMANDS", r#"{"next_by_subj":"capstan.v1.cmd.h2"}"#),
            ("capstan.js.API.STREAM.MSG.GET.CAPSTAN_COMMANDS", r#"{"next_by_subj":"capstan.v1.cmd.h2"}"#),
            ("$JS.API.CONSUMER.MSG.NEXT.CAPSTAN_COMMANDS.agent-h2", r#"{"batch":1}"#),
            ("$JS.API.STREAM.INFO.CAPSTAN_COMMANDS", r#"{"subjects_filter":">"}"#),
            ("$JS.API.STREAM.NAMES", "{}"),
        ] {
            // Nothing answers (at once, or ever: the server's own "not enabled"
            // responder does not answer every API subject), or "not enabled".
            let answer =
                tokio::time::timeout(Duration::from_secs(2), attacker.request(subject, body.into()))
                    .await;
            match answer {
                Err(_) => {}
                Ok(Err(e)) => assert!(
                    matches!(
                        e.kind(),
                        async_nats::RequestErrorKind::NoResponders
                            | async_nats::RequestErrorKind::TimedOut
                    ),
                    "{subject}: {e}"
                ),
                Ok(Ok(m)) => {
                    let text = String::from_utf8_lossy(&m.payload);
                    assert!(
                        text.contains("JetStream not enabled for account"),
                        "{subject}: {text}"
                    );
                    for leak in ["h2", "capstan.v1.cmd", "KV_capstan"] {
                        assert!(!text.contains(leak), "{subject}: {text}");
                    }
                }
            }
        }
        // What h1 may read of its own storage names nobody else.
        let own = attacker
            .request("capstan.js.API.DIRECT.GET.CAPSTAN_EVT.capstan.v1.evt.h1", "".into())
            .await
            .expect("h1 reads its own last record");
        let text = String::from_utf8_lossy(&own.payload);
        assert!(text.contains("\"seq\"") && !text.contains("h2"), "{text}");
        // Everything h2 hears or says, and everything at all.
        let mut heard = Vec::new();
        for subject in [
            "capstan.v1.cmd.h2",
            "capstan.v1.sync.>",
            "capstan.v1.rpc.h2.*",
            "capstan.v1.res.h2.>",
            "capstan.v1.evt.h2",
            "capstan.v1.beat.>",
            "_INBOX_h2.>",
            "_INBOX.>",
            ">",
        ] {
            heard.push(attacker.subscribe(subject).await.expect("subscribe"));
        }
        attacker.flush().await.expect("flush");
        // h2 now takes a command, answers RPCs and beats; h1 hears none of it.
        v.h2_is_unaffected("while-listening");
        attacker.flush().await.expect("flush");
        for mut subscription in heard {
            while let Ok(Some(m)) =
                tokio::time::timeout(Duration::from_millis(1), subscription.next()).await
            {
                assert!(
                    !m.subject.contains("h2"),
                    "h1 heard {} ({})",
                    m.subject,
                    String::from_utf8_lossy(&m.payload)
                );
            }
        }
    });
    v.stop();
}

/// h1 and h2 share a storage shard, h3 has one of its own (two hosts to a shard). A
/// flood of h1's own results fills its shard's quota: refused, never evicted. h3 goes
/// on untouched. h2's command is carried out, its records and result wait in its log
/// (the shard refuses them too: the documented price of a shard), and once the
/// operator quarantines h1 as `docs/nats.md` says (h1 off the config, the shard's
/// quota raised, the server restarted) they arrive: h2's command reads succeeded and
/// `capstan verify h2` is ok.
#[test]
fn a_flood_of_h1s_own_results_fills_only_its_shard_until_h1_is_quarantined() {
    let accounts = Accounts::generate_sharded(&["h1", "h2", "h3"], "32M", "2G", Some(2));
    let mut fleet = Fleet::with(accounts);
    let agents: Vec<Agent> = ["h1", "h2", "h3"]
        .iter()
        .map(|h| fleet.agent(h).build())
        .collect();
    let mut daemons: Vec<_> = agents.iter().map(Agent::run).collect();
    let c = &fleet.coordinator;
    for (i, agent) in agents.iter().enumerate() {
        c.run_all(&[agent
            .commands("shop")
            .ensure_namespace(&format!("before-{i}"))]);
    }
    let h1 = Credentials {
        user: "h1".into(),
        seed: fleet.accounts.as_ref().expect("accounts").seed("h1"),
        url: fleet.server.url(),
    };
    // Values of 400 KiB until one is refused, then smaller ones into what is left,
    // down to a byte: the shard is full for anything h2 would write.
    let refused: Vec<(u32, String)> = runtime().block_on(async {
        let attacker = jetstream::new(h1.connect().await);
        let mut refused = Vec::new();
        for size in [400 * 1024, 4096, 64, 1] {
            let value = vec![b'x'; size];
            let mut stored = 0u32;
            refused.push(loop {
                let put = attacker
                    .publish(
                        format!("$KV.capstan_results.h1.flood{size}x{stored}"),
                        value.clone().into(),
                    )
                    .await;
                match put {
                    Ok(ack) => match ack.await {
                        Ok(_) => stored += 1,
                        Err(e) => break (stored, e.to_string()),
                    },
                    Err(e) => break (stored, e.to_string()),
                }
                assert!(stored < 1000, "the quota never stopped the flood");
            });
        }
        refused
    });
    // 32 MiB of 400 KiB values (less what the three hosts had written), then the
    // shard's limit.
    assert!(refused[0].0 >= 40 && refused[0].0 <= 100, "{refused:?}");
    for (_, error) in &refused {
        assert!(error.contains("resource limits exceeded"), "{refused:?}");
    }
    // h3, in the other shard: untouched.
    c.run_all(&[agents[2].commands("shop").ensure_namespace("h3-during")]);
    assert_eq!(c.cli_json(&["verify", "h3"], 0)["result"], "ok");
    // h2 carries its command out; what it writes waits in its log.
    let applied = |v: &Value| v["applied_seq"].as_u64().expect("applied_seq");
    let before = applied(&c.cli_json(&["intent", "h2"], 0));
    let id = c.submit(&agents[1].commands("shop").ensure_namespace("h2-during"));
    wait_until("h2 to carry its command out", READY, || {
        (applied(&c.cli_json(&["intent", "h2"], 0)) > before).then_some(())
    });
    let during = c.cli_json(&["status", &id], 0);
    assert_ne!(during["status"], "succeeded", "{during}");
    // The quarantine: h1's agent stopped and its account gone from the config, the
    // shard's quota raised, the server restarted.
    daemons.remove(0).stop();
    let accounts = fleet.accounts.as_mut().expect("accounts");
    accounts.set_shard_quota("64M");
    accounts.regenerate(&["h2", "h3"]);
    let shards = std::fs::read_to_string(accounts.shards_file()).expect("shards");
    assert!(shards.ends_with("h2 0\nh3 1\n"), "{shards}");
    fleet.server.stop();
    fleet.server.restart();
    let c = &fleet.coordinator;
    // (The coordinator answers 503 until it has reconnected.)
    let done = wait_until(
        "h2's command to read done once its shard has room",
        READY,
        || {
            let out = c.cli(&["wait", &id, "--timeout", "10s"]);
            out.status
                .success()
                .then(|| serde_json::from_slice::<Value>(&out.stdout).expect("wait --json"))
        },
    );
    assert_eq!(done["status"], "succeeded", "{done}");
    for host in ["h2", "h3"] {
        let verified = c.cli_json(&["verify", host], 0);
        assert_eq!(verified["result"], "ok", "{host}: {verified}");
    }
    for d in daemons {
        d.stop();
    }
    fleet.stop();
}

#[test]
fn h1s_nats_credentials_without_its_host_key_forge_nothing_the_coordinator_takes() {
    let mut v = victim("64M");
    v.stop_h1();
    let c = &v.fleet.coordinator;
    let (last_seq, last_stream_seq) = runtime().block_on(async {
        let attacker = jetstream::with_prefix(v.connect("h1").await, nats_layout::HOST_API_PREFIX);
        // An unsigned heartbeat on h1's own subject.
        let beat = serde_json::json!({"host": "h1", "version": "evil", "drivers": [],
            "capabilities": {}, "last_seq": 0, "at": chrono::Utc::now()});
        let client = attacker.client();
        client
            .publish(nats_layout::beat_subject("h1"), beat.to_string().into())
            .await
            .expect("publish");
        client.flush().await.expect("flush");
        // An unsigned final result for h1's own command, where a final one is read.
        let status = serde_json::json!({"id": "mine", "host": "h1", "status": "failed",
            "done": true, "error": {"code": "forged", "message": "forged"}, "events": []});
        attacker
            .publish(
                nats_layout::final_result_subject("h1", "mine"),
                status.to_string().into(),
            )
            .await
            .expect("publish")
            .await
            .expect("stored");
        let last = last_record(&attacker).await;
        let seq = serde_json::from_slice::<Value>(&last.payload).expect("record")["seq"]
            .as_u64()
            .expect("seq");
        (seq, last.sequence)
    });
    // The beat is refused as unverified (never taken: h1's listed beat stays its
    // own), the result refused.
    wait_until("the unsigned beat refused", READY, || {
        (c.metric(r#"capstan_coordinator_beats_total{outcome="unverified"}"#) >= Some(1))
            .then_some(())
    });
    let hosts = c.cli_json(&["hosts"], 0);
    let h1 = hosts["hosts"]
        .as_array()
        .and_then(|a| a.iter().find(|h| h["host"] == "h1"))
        .expect("h1 listed");
    assert_ne!(h1["beat"]["version"], "evil", "{h1}");
    let out = c.cli(&["status", "mine"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unverified"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An unsigned record, in sequence, on h1's own subject: its events and verify
    // are refused, never shown.
    runtime().block_on(async {
        let attacker = jetstream::with_prefix(v.connect("h1").await, nats_layout::HOST_API_PREFIX);
        let record = serde_json::json!({"host": "h1", "seq": last_seq + 1, "kind": "namespace_ready",
            "at": chrono::Utc::now(), "prev_hash": "00", "namespace": "forged"});
        let message = jetstream::message::PublishMessage::build()
            .payload(record.to_string().into())
            .expected_last_subject_sequence(last_stream_seq);
        attacker
            .send_publish("capstan.v1.evt.h1", message)
            .await
            .expect("publish")
            .await
            .expect("stored after h1's last record");
    });
    let out = c.cli(&["log", "h1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unverified"));
    assert_eq!(c.cli(&["verify", "h1"]).status.code(), Some(2));
    v.h2_is_unaffected("after-forgeries");
    v.stop();
}

/// A host that lies with its own key — a result saying its events span a billion
/// records — makes the coordinator read no more than its bound: the read is refused
/// (`result_unreadable`), and the coordinator goes on serving.
#[test]
fn a_result_claiming_a_billion_records_is_refused_not_read() {
    let mut v = victim("64M");
    v.stop_h1();
    let key = std::fs::read_to_string(v.h1.data_dir().join("host.key")).expect("h1's key");
    let key = capstan_common::signing::Signer::from_hex(&key).expect("a key");
    runtime().block_on(async {
        let attacker = jetstream::new(v.connect("h1").await);
        let status = serde_json::json!({"id": "mine", "host": "h1", "status": "succeeded",
            "done": true, "error": null, "events": [], "events_truncated": true,
            "first_seq": 1, "last_seq": 1_000_000_000u64});
        let body = status.to_string().into_bytes();
        let mut headers = async_nats::HeaderMap::new();
        let what = capstan_common::published::Publication::Result;
        let batch = key.sign_batch(what, &[&body]);
        headers.insert(capstan_common::published::HEADER, batch.sig.as_str());
        headers.insert(
            capstan_common::published::PROOF_HEADER,
            batch.proofs[0].as_str(),
        );
        attacker
            .publish_with_headers(
                nats_layout::final_result_subject("h1", "mine"),
                headers,
                body.into(),
            )
            .await
            .expect("publish")
            .await
            .expect("stored");
    });
    let c = &v.fleet.coordinator;
    let out = c.cli(&["status", "mine"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("result_unreadable"), "{stderr}");
    v.h2_is_unaffected("after-the-lie");
    v.stop();
}

/// What the outbox's exactly-once rests on, on h1's own stream: a record is stored
/// only right after the subject's last message, so a stale or repeated publish (one
/// expecting the subject empty, or at an older message) is refused (2.9.10 checks 0
/// as "empty" too).
#[test]
fn h1s_own_subject_takes_a_record_only_right_after_its_last() {
    let mut v = victim("64M");
    v.stop_h1();
    runtime().block_on(async {
        let attacker = jetstream::with_prefix(v.connect("h1").await, nats_layout::HOST_API_PREFIX);
        let last = last_record(&attacker).await.sequence;
        for expected in [0, last - 1] {
            let message = jetstream::message::PublishMessage::build()
                .payload("{}".into())
                .expected_last_subject_sequence(expected);
            let stored = attacker
                .send_publish("capstan.v1.evt.h1", message)
                .await
                .expect("publish")
                .await;
            assert!(
                matches!(
                    &stored,
                    Err(e) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence
                ),
                "expected {expected}: {stored:?}"
            );
        }
    });
    v.h2_is_unaffected("after-stale-publishes");
    v.stop();
}

/// With h2's agent down and three commands queued for it, h1's credentials ack,
/// delete and consume with everything a host could reach on earlier releases (its
/// acks carried any stream sequence, and the command stream was a work queue: an ack
/// removed another host's command) and ring h2's bell; none of it reaches the
/// command stream, and h2, back, carries out all three.
#[test]
fn h1_can_neither_ack_nor_delete_nor_take_the_commands_queued_for_h2() {
    let mut v = victim("64M");
    // h2 down; three commands wait for it.
    let h2_daemon = v.daemons.remove(1);
    h2_daemon.stop();
    let c = &v.fleet.coordinator;
    let ids: Vec<String> = ["q-1", "q-2", "q-3"]
        .iter()
        .map(|id| c.submit(&v.h2.commands("shop").ensure_namespace(id)))
        .collect();
    runtime().block_on(async {
        let fleet_js = jetstream::new(v.connect("coordinator").await);
        let mut stream = fleet_js
            .get_stream("CAPSTAN_COMMANDS")
            .await
            .expect("stream");
        let before = stream.info().await.expect("info").state.clone();
        let attacker = v.connect("h1").await;
        for seq in 1..=before.last_sequence + 5 {
            for stream in ["CAPSTAN_COMMANDS", "CAPSTAN_CMD"] {
                for consumer in ["agent-h1", "agent-h2"] {
                    for prefix in ["$JS.ACK", "capstan.js.ACK"] {
                        let ack = format!("{prefix}.{stream}.{consumer}.1.{seq}.{seq}.0.0");
                        attacker.publish(ack, "".into()).await.expect("publish");
                    }
                }
            }
            for api in ["capstan.js.API", "$JS.API"] {
                let delete = format!("{api}.STREAM.MSG.DELETE.CAPSTAN_COMMANDS");
                let body = format!(r#"{{"seq":{seq}}}"#);
                attacker
                    .publish(delete, body.into())
                    .await
                    .expect("publish");
            }
        }
        // h2's bell, rung by h1: it stays in h1's own account.
        attacker
            .publish("capstan.v1.cmd.h2", "{}".into())
            .await
            .expect("publish");
        attacker.flush().await.expect("flush");
        // Answered in order after the publishes above: h1's own sync request.
        let own = attacker
            .request(
                nats_layout::sync_subject("h1"),
                r#"{"after":0,"max":64}"#.into(),
            )
            .await
            .expect("h1's sync request is answered");
        let own: capstan_common::nats::SyncAnswer =
            serde_json::from_slice(&own.payload).expect("a sync answer");
        assert!(
            own.commands.iter().all(|q| !q.command.contains("\"h2\"")),
            "h1 is given only its own commands: {own:?}"
        );
        let after = stream.info().await.expect("info").state.clone();
        assert_eq!(
            (after.messages, after.last_sequence),
            (before.messages, before.last_sequence),
            "nothing left the command stream"
        );
    });
    let h2_daemon = v.h2.run();
    for id in &ids {
        let done = c.cli_json(&["wait", id, "--timeout", "60s"], 0);
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    v.daemons.push(h2_daemon);
    v.h2_is_unaffected("after-acks");
    v.stop();
}

/// The limits of a host's account (`docs/nats.md`, *Security model*):
/// `capstan-coordinator nats-config` writes them.
const HOST_MAX_CONNECTIONS: usize = 4;
/// Per connection (nats-server applies an account's `max_subscriptions` to each).
const HOST_MAX_SUBSCRIPTIONS: usize = 32;
/// What h1's running agent holds of them: one connection.
const AGENT_CONNECTIONS: usize = 1;

/// h1's credentials cannot use up what every host shares: past its account's limits
/// a connection or a subscription is refused, and nothing h1 may ask waits in the
/// server's one JetStream API queue, so a flood of every request it can make (its
/// streams' info once among them: the coordinators' requests were dropped) leaves
/// h2's commands completing.
#[test]
fn h1s_credentials_cannot_use_up_connections_subscriptions_or_the_jetstream_api() {
    let mut v = victim("64M");
    let h1 = v.credentials("h1");
    runtime().block_on(async {
        // Connections: up to the limit (h1's agent holds one), then refused.
        let mut held = Vec::new();
        let refused = loop {
            let connected = async_nats::ConnectOptions::with_nkey(h1.seed.clone())
                .connect(&h1.url)
                .await;
            match connected {
                Ok(c) => {
                    // Refused after CONNECT: the server closes it on the first PING.
                    match c.flush().await {
                        Ok(()) => held.push(c),
                        Err(e) => break e.to_string(),
                    }
                }
                Err(e) => break e.to_string(),
            }
            assert!(
                held.len() + AGENT_CONNECTIONS <= HOST_MAX_CONNECTIONS,
                "{} connections of h1 were taken",
                held.len()
            );
        };
        assert_eq!(
            held.len(),
            HOST_MAX_CONNECTIONS - AGENT_CONNECTIONS,
            "then: {refused}"
        );
        // Subscriptions: those past the limit are never made (the server says
        // "maximum subscriptions exceeded" and keeps the connection), so of one
        // message to each subject only the limit's worth arrive.
        let client = held.pop().expect("a connection");
        drop(held);
        let mut subs = Vec::new();
        for i in 0..HOST_MAX_SUBSCRIPTIONS * 2 {
            subs.push(
                client
                    .subscribe(format!("many.{i}"))
                    .await
                    .expect("subscribe"),
            );
        }
        client.flush().await.expect("flush");
        for i in 0..HOST_MAX_SUBSCRIPTIONS * 2 {
            client
                .publish(format!("many.{i}"), "x".into())
                .await
                .expect("publish");
        }
        client.flush().await.expect("flush");
        let mut heard = 0;
        for sub in &mut subs {
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), sub.next()).await
            {
                heard += 1;
            }
        }
        assert_eq!(
            heard, HOST_MAX_SUBSCRIPTIONS,
            "subscriptions of one connection"
        );
    });
    // The attacker holds h1's credentials, not its process.
    v.stop_h1();
    // Sync requests asked all at once: the coordinator works on two of h1's at a
    // time and answers the rest `busy` at once, without reading the stream; every
    // request is answered.
    let answers: Vec<Value> = runtime().block_on(async {
        let attacker = v.connect("h1").await;
        let asked = (0..200).map(|_| {
            attacker.request(
                nats_layout::sync_subject("h1"),
                r#"{"after":0,"max":64}"#.into(),
            )
        });
        futures::future::join_all(asked)
            .await
            .into_iter()
            .map(|a| serde_json::from_slice(&a.expect("an answer").payload).expect("json"))
            .collect()
    });
    let busy = answers
        .iter()
        .filter(|a| a["error"].as_str().is_some_and(|e| e.starts_with("busy")))
        .count();
    let served = answers.iter().filter(|a| a["error"].is_null()).count();
    eprintln!("{busy} busy, {served} served of 200 sync requests asked at once");
    assert!(
        busy > 0 && served > 0,
        "{busy} busy, {served} served of 200"
    );
    // The JetStream API and the coordinators' sync service, flooded while h2 works.
    let flood = background(v.credentials("h1"), |h1, stop| async move {
        let attacker = h1.connect().await;
        let prefix = nats_layout::HOST_API_PREFIX;
        let requests = [
            format!("{prefix}.STREAM.INFO.CAPSTAN_EVT"),
            format!("{prefix}.STREAM.INFO.KV_capstan_results"),
            format!("{prefix}.DIRECT.GET.CAPSTAN_EVT.capstan.v1.evt.h1"),
            format!("{prefix}.DIRECT.GET.KV_capstan_results.$KV.capstan_results.h1._progress"),
            nats_layout::sync_subject("h1"),
        ];
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..500 {
                for r in &requests {
                    attacker
                        .publish_with_reply(
                            r.clone(),
                            "_INBOX.nobody".to_string(),
                            r#"{"after":0,"max":64}"#.into(),
                        )
                        .await
                        .expect("publish");
                    sent += 1;
                }
            }
            attacker.flush().await.expect("flush");
        }
        sent
    });
    v.h2_is_unaffected("during-a-flood");
    let sent = flood.stop();
    eprintln!("h1 sent {sent} requests while h2 worked");
    v.h2_is_unaffected("after-a-flood");
    v.stop();
}

/// h1's agent signs whatever asks it in h1's own account; with h1's NATS credentials
/// an attacker gets such answers (with a nonce of its choosing, or none) and, h1's
/// agent gone, answers the coordinator's next requests with them. Each is refused
/// (`unverified`): an answer's signature covers the nonce of the request it answers,
/// which the coordinator draws at random for each.
#[test]
fn h1s_signed_answers_replayed_to_a_later_request_are_refused() {
    let mut v = victim("64M");
    let captured = runtime().block_on(async {
        let attacker = v.connect("h1").await;
        let mut captured = Vec::new();
        for nonce in [None, Some("0123456789abcdef0123456789abcdef")] {
            let mut headers = async_nats::HeaderMap::new();
            if let Some(n) = nonce {
                headers.insert(capstan_common::published::NONCE_HEADER, n);
            }
            let answer = attacker
                .request_with_headers(
                    nats_layout::rpc_subject("h1", "intent"),
                    headers,
                    "{}".into(),
                )
                .await
                .expect("h1's agent answers its own account");
            assert!(
                answer
                    .headers
                    .as_ref()
                    .is_some_and(|h| h.get(capstan_common::published::HEADER).is_some()),
                "a signed answer"
            );
            captured.push((answer.payload, answer.headers.expect("headers")));
        }
        captured
    });
    v.stop_h1();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let replayer = background(v.credentials("h1"), move |h1, stop| async move {
        let attacker = h1.connect().await;
        let mut requests = attacker
            .subscribe(nats_layout::rpc_subject("h1", "*"))
            .await
            .expect("subscribe");
        attacker.flush().await.expect("flush");
        ready_tx.send(()).expect("ready");
        let mut replayed = 0;
        while !stop.load(Ordering::Relaxed) {
            let Ok(Some(request)) =
                tokio::time::timeout(Duration::from_millis(100), requests.next()).await
            else {
                continue;
            };
            let (payload, headers) = &captured[replayed % captured.len()];
            let reply = request.reply.expect("a reply subject");
            attacker
                .publish_with_headers(reply, headers.clone(), payload.clone())
                .await
                .expect("publish");
            attacker.flush().await.expect("flush");
            replayed += 1;
        }
        replayed
    });
    ready.recv().expect("the replayer listens");
    let c = &v.fleet.coordinator;
    for _ in 0..2 {
        let out = c.cli(&["intent", "h1"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(
            out.status.code(),
            Some(0),
            "a replayed answer was taken: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(stderr.contains("unverified"), "{stderr}");
    }
    let replayed = replayer.stop();
    assert!(
        replayed >= 2,
        "every request was answered by the replayer: {replayed}"
    );
    v.h2_is_unaffected("after-replays");
    v.stop();
}

/// With h1's NATS credentials, a replay of one of h1's own signed records (its last,
/// read early on) and junk are put last on h1's subject, once while h1's agent runs
/// and once while it is down. Neither stalls its outbox (before: junk last on the
/// subject stopped it for good) nor has it publish again what it did: each time h1's
/// next command completes and its records follow, once each, after the planted
/// message. The coordinator refuses the replays when reading — every read of h1's
/// records, from any `since`, answers each record once and none left out, and
/// `capstan verify h1` stays ok — and refuses the junk (`capstan verify h1` exits 2).
#[test]
fn junk_or_a_replayed_record_last_on_h1s_subject_stalls_nothing() {
    let mut v = victim("64M");
    let mut h1_daemon = Some(v.daemons.remove(0));
    let h1 = v.credentials("h1");
    // What h1's credentials can read of h1's records: the last one, signed.
    let captured = runtime().block_on(async {
        let attacker = jetstream::with_prefix(h1.connect().await, nats_layout::HOST_API_PREFIX);
        last_record(&attacker).await
    });
    let put_last = |junk: bool| {
        runtime().block_on(async {
            let attacker = h1.connect().await;
            let attacker = jetstream::new(attacker);
            let (payload, headers) = if junk {
                ("not a record".into(), async_nats::HeaderMap::new())
            } else {
                // Its signature and proof; not the expected last sequence it was
                // published with.
                let mut headers = async_nats::HeaderMap::new();
                for name in [
                    capstan_common::published::HEADER,
                    capstan_common::published::PROOF_HEADER,
                ] {
                    let value = captured.headers.get(name).expect("signed").as_str();
                    headers.insert(name, value);
                }
                (captured.payload.clone(), headers)
            };
            attacker
                .publish_with_headers("capstan.v1.evt.h1", headers, payload)
                .await
                .expect("publish")
                .await
                .expect("stored last on h1's subject");
        })
    };
    let c = &v.fleet.coordinator;
    let run_while_up = |round: u32, junk: bool| {
        put_last(junk);
        c.run_all(&[v
            .h1
            .commands("mine")
            .ensure_namespace(&format!("running-{round}"))]);
    };
    let run_after_down = |round: u32, junk: bool| {
        put_last(junk);
        let daemon = v.h1.run();
        c.run_all(&[v
            .h1
            .commands("mine")
            .ensure_namespace(&format!("restarted-{round}"))]);
        daemon.stop();
    };
    // The replays first: while up (the captured record is still the last), then, two
    // commands later, while down (now an older one, behind later records).
    run_while_up(1, false);
    run_while_up(2, false);
    h1_daemon.take().expect("h1 runs").stop();
    run_after_down(3, false);
    // (`verify` asks h1's agent for its own copy.)
    h1_daemon = Some(v.h1.run());
    // h1's records as its log has them, and as every read of the coordinator answers.
    let records = wait_until("h1's records of restarted-3 in CAPSTAN_EVT", READY, || {
        let records = c.events("h1");
        records
            .iter()
            .any(|r| r["command_id"] == "restarted-3" && r["kind"] == "command_completed")
            .then_some(records)
    });
    let last = records.len() as u64;
    let seqs: Vec<u64> = records.iter().filter_map(|r| r["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "each record once");
    for since in 0..=last {
        let (code, body) = c.get(&format!("/v1/hosts/h1/events?since={since}"));
        assert_eq!(code, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).expect("JSON");
        let seqs: Vec<u64> = answer["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter_map(|r| r["seq"].as_u64())
            .collect();
        assert_eq!(
            seqs,
            (since + 1..=last).collect::<Vec<_>>(),
            "h1's records after {since}: each once, none left out"
        );
    }
    let verified = c.cli_json(&["verify", "h1"], 0);
    assert_eq!(verified["result"], "ok", "the replays refused: {verified}");
    // Then junk, while up and while down.
    run_while_up(4, true);
    h1_daemon.take().expect("h1 runs").stop();
    run_after_down(5, true);
    h1_daemon = Some(v.h1.run());
    // Every record of h1's once, in order, between the planted messages.
    let seqs: Vec<u64> = runtime().block_on(async {
        let store = jetstream::with_prefix(
            v.connect("coordinator-hosts").await,
            &nats_layout::store_api_prefix("h1"),
        );
        let stream = store.get_stream("CAPSTAN_EVT").await.expect("h1's stream");
        let mut seqs = Vec::new();
        let mut at = 1;
        while let Ok(m) = stream.get_raw_message(at).await {
            // The shard's stream holds h2's records too.
            if m.subject.as_str() == "capstan.v1.evt.h1" {
                if let Ok(body) = serde_json::from_slice::<Value>(&m.payload) {
                    seqs.push(body["seq"].as_u64().expect("seq"));
                }
            }
            at += 1;
        }
        seqs
    });
    let mut once = seqs.clone();
    once.sort_unstable();
    once.dedup();
    let replays = seqs.len() - once.len();
    assert_eq!(
        replays, 3,
        "only the three planted replays repeat a seq: {seqs:?}"
    );
    assert_eq!(
        once,
        (1..=once.len() as u64).collect::<Vec<_>>(),
        "{seqs:?}"
    );
    let out = c.cli(&["verify", "h1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unverified"),
        "the junk is refused when read: {stderr}"
    );
    v.h2_is_unaffected("after-junk-on-h1s-subject");
    h1_daemon.take().expect("h1 runs").stop();
    v.stop();
}

/// h1's NATS credentials put one of h1's own unfinished results again — signed by
/// h1, heard on its way while the command waited in a hook — after the command's
/// final result: under the key it came from, and as a notice. The command still
/// reads `succeeded` (`capstan status`, `capstan wait`): a final result lives under
/// its own key, which no unfinished one is put under (before: the one key held the
/// last put, and the status went back to `running`).
#[test]
fn h1s_unfinished_result_put_again_after_its_final_one_changes_no_status() {
    // The namespace `slow` waits in its hook until the test opens the gate.
    let gate = r#"case "$req" in *'"namespace":"slow"'*)
  while [ ! -e "$(dirname "$0")/gate" ]; do sleep 0.05; done;;
esac
exit 0"#;
    let v = victim_with("64M", |h1| {
        let phases = ["after_namespace_prepared", "before_namespace_delete"];
        h1.hook(Hook::new("gate", &phases, gate))
    });
    let c = &v.fleet.coordinator;
    let id = "slow-1";
    let (unfinished, finished) = runtime().block_on(async {
        // The coordinators' reach into the hosts, which hears the notices.
        let fleet = v.connect("coordinator-hosts").await;
        let mut notices = fleet
            .subscribe(nats_layout::result_notice_subject("h1", id))
            .await
            .expect("subscribe");
        c.submit(&v.h1.commands("slow").ensure_namespace(id));
        let mut unfinished = None;
        let mut finished = None;
        while finished.is_none() {
            let notice = tokio::time::timeout(READY, notices.next())
                .await
                .expect("h1's results of slow-1 in time")
                .expect("the subscription");
            let status: Value = serde_json::from_slice(&notice.payload).expect("a status");
            if status["done"] == true {
                finished = Some(status);
            } else if unfinished.is_none() {
                // Heard: the gate opens.
                std::fs::write(v.h1.path("gate"), "").expect("open the gate");
                unfinished = Some(notice);
            }
        }
        (unfinished.expect("an unfinished result"), finished.unwrap())
    });
    assert_eq!(finished["status"], "succeeded", "{finished}");
    runtime().block_on(async {
        let attacker = v.connect("h1").await;
        let headers = unfinished.headers.clone().expect("signed");
        jetstream::new(attacker.clone())
            .publish_with_headers(
                nats_layout::result_subject("h1", id),
                headers.clone(),
                unfinished.payload.clone(),
            )
            .await
            .expect("publish")
            .await
            .expect("stored");
        attacker
            .publish_with_headers(
                nats_layout::result_notice_subject("h1", id),
                headers,
                unfinished.payload.clone(),
            )
            .await
            .expect("notice");
        attacker.flush().await.expect("flush");
    });
    let status = c.cli_json(&["status", id], 0);
    assert_eq!(status["status"], "succeeded", "{status}");
    let waited = c.cli_json(&["wait", id], 0);
    assert_eq!(waited["status"], "succeeded", "{waited}");
    v.h2_is_unaffected("after-the-replayed-result");
    v.stop();
}

/// More than the least time a coordinator keeps between two beats of one host that
/// it looks at (`fleet::liveness::MIN_GAP`, 200 ms): one sooner is dropped unchecked.
const BEAT_GAP: Duration = Duration::from_millis(250);

/// Whoever holds h1's NATS credentials can send one of h1's signed beats again (it
/// travels on h1's own subject, which its credentials publish on): the coordinator
/// refuses a beat no later than the one it keeps, and h1's listed beat is never the
/// replayed one.
#[test]
fn h1s_signed_beat_sent_again_later_is_refused() {
    let v = victim("64M");
    let c = &v.fleet.coordinator;
    let (first, second) = runtime().block_on(async {
        let fleet = v.connect("coordinator").await;
        let mut beats = fleet
            .subscribe(nats_layout::beat_subject("h1"))
            .await
            .expect("subscribe");
        fleet.flush().await.expect("flush");
        let mut two = Vec::new();
        while two.len() < 2 {
            let beat = tokio::time::timeout(READY, beats.next())
                .await
                .expect("a beat of h1 in time")
                .expect("a beat");
            let at = at_of(&serde_json::from_slice::<Value>(&beat.payload).expect("a beat"));
            two.push((beat, at));
        }
        let second = two.pop().expect("two beats").1;
        (two.pop().expect("two beats"), second)
    });
    let listed_at = || {
        let hosts = c.cli_json(&["hosts"], 0);
        hosts["hosts"]
            .as_array()
            .and_then(|a| a.iter().find(|h| h["host"] == "h1"))
            .map(|h| at_of(&h["beat"]))
    };
    wait_until("h1's second beat taken", READY, || {
        listed_at().filter(|at| *at >= second).map(drop)
    });
    std::thread::sleep(BEAT_GAP);
    let (beat, first_at) = first;
    runtime().block_on(async {
        let attacker = v.connect("h1").await;
        attacker
            .publish_with_headers(
                beat.subject.clone(),
                beat.headers.clone().expect("signed"),
                beat.payload.clone(),
            )
            .await
            .expect("publish");
        attacker.flush().await.expect("flush");
    });
    let replayed = r#"capstan_coordinator_beats_total{outcome="replayed"}"#;
    wait_until("the beat sent again refused", READY, || {
        (c.metric(replayed) >= Some(1)).then_some(())
    });
    let at = listed_at().expect("h1 listed");
    assert!(
        at > first_at && at >= second,
        "{at} listed, replayed {first_at}"
    );
    v.h2_is_unaffected("after-replayed-beat");
    v.stop();
}

/// A beat's `at`.
fn at_of(beat: &Value) -> chrono::DateTime<chrono::Utc> {
    beat["at"]
        .as_str()
        .and_then(|at| at.parse().ok())
        .unwrap_or_else(|| panic!("a beat with its time: {beat}"))
}
