//! Where the agent reads its next commands from: the command stream itself, or on
//! per-host accounts (where the host may not read the stream, which holds every
//! host's commands) the coordinators, which read it for the host the request's
//! subject names.

use super::super::Link;
use async_nats::jetstream::stream;
use capstan_common::nats::{self as cnats, Retention, SyncAnswer, SyncRequest};
use capstan_common::nats_layout;

/// The command stream and the stream of the results bucket.
type Streams = (stream::Stream, stream::Stream);

pub(super) enum Source {
    /// Reads the command stream and the results bucket (one account for the whole
    /// fleet); makes them when this agent is the first to need them.
    Stream {
        /// Boxed, as is `made`: the enum's variants stay of a size.
        link: Box<Link>,
        host: String,
        /// Boxed: a stream handle holds a whole JetStream context.
        made: Box<tokio::sync::OnceCell<Streams>>,
    },
    /// Asks on `capstan.v1.sync.<host>` (per-host accounts).
    Coordinators {
        client: async_nats::Client,
        subject: String,
    },
}

impl Source {
    pub(super) fn new(link: &Link, host: &str) -> Source {
        if link.host_accounts {
            Source::Coordinators {
                client: link.js.client(),
                subject: nats_layout::sync_subject(host),
            }
        } else {
            Source::Stream {
                link: Box::new(link.clone()),
                host: host.to_string(),
                made: Box::default(),
            }
        }
    }

    /// The host's commands after stream sequence `after`, at most `max`.
    pub(super) async fn after(&self, after: u64, max: usize) -> Result<SyncAnswer, String> {
        match self {
            Source::Stream { link, host, made } => {
                let (commands, results) = made
                    .get_or_try_init(|| async {
                        let commands = cnats::cmd_stream(&link.js, link.replicas).await?;
                        let results = cnats::results_bucket(
                            &link.js,
                            Retention::default().commands_max_age,
                            link.replicas,
                            link.scope(),
                        )
                        .await?;
                        Ok::<_, cnats::NatsError>((commands, results.stream))
                    })
                    .await
                    .map_err(|e| capstan_common::report(&e))?;
                cnats::commands_after(commands, results, host, after, max)
                    .await
                    .map_err(|e| capstan_common::report(&e))
            }
            Source::Coordinators { client, subject } => {
                let request = serde_json::to_vec(&SyncRequest { after, max })
                    .expect("a sync request serialises");
                let reply = client
                    .request(subject.clone(), request.into())
                    .await
                    .map_err(|e| format!("{subject}: {e}"))?;
                let answer: SyncAnswer = serde_json::from_slice(&reply.payload)
                    .map_err(|e| format!("{subject}: not a sync answer: {e}"))?;
                match answer.error {
                    Some(error) => Err(format!("{subject}: {error}")),
                    None => Ok(answer),
                }
            }
        }
    }
}
