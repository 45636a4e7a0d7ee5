//! Where each host's records (`CAPSTAN_EVT`) and results (`capstan_results`) are.
//!
//! - One account for the fleet: one stream and one bucket for every host, in the
//!   coordinators' account ([`Scope::Shared`]).
//! - Per-host accounts (`[nats] host_accounts`, `capstan-coordinator nats-config`):
//!   the stream and bucket of the host's **storage shard** (an account `SHARD_<n>`
//!   for up to `--hosts-per-shard` hosts), which the host reaches only through its
//!   own subjects and the coordinators' `CAPSTAN_HOSTS` account reaches whole under
//!   [`nats_layout::store_api_prefix`] of each of its hosts ([`Scope::Host`]): a
//!   coordinator needs no map of shards, the host's name finds them. The shard's
//!   quota bounds its hosts together (nothing is evicted; a full shard refuses). A
//!   coordinator makes a shard's stream and bucket the first time one of its hosts
//!   needs them (a registration, a submission, a read), with today's limits; for
//!   the shard's other hosts they are then already there.
//!
//! Each host's handles are opened once per coordinator, in three requests (the
//! account's info, each stream's), and hosts are opened side by side: when 10,000
//! hosts start at once, their first sync requests do not queue behind each other.

use super::FleetError;
use async_nats::jetstream::{self, stream};
use capstan_common::nats::{self as cnats, Retention, Scope};
use capstan_common::nats_layout;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;

/// One host's stream and bucket (the bucket as its backing stream, read with direct
/// gets so that a result's signature header comes with it).
#[derive(Clone)]
pub(super) struct Storage {
    pub evt: stream::Stream,
    pub results: stream::Stream,
}

pub(super) struct Stores {
    client: async_nats::Client,
    retention: Retention,
    host_accounts: bool,
    shared: OnceCell<Storage>,
    /// Each host's handles, opened once (a failed open is tried again next time).
    hosts: Mutex<HashMap<String, Arc<OnceCell<Storage>>>>,
}

impl Stores {
    pub(super) fn new(
        client: async_nats::Client,
        retention: Retention,
        host_accounts: bool,
    ) -> Self {
        Stores {
            client,
            retention,
            host_accounts,
            shared: OnceCell::new(),
            hosts: Mutex::default(),
        }
    }

    /// Where the fleet's own event stream and results bucket are: with per-host
    /// accounts, nowhere.
    pub(super) fn scope(&self) -> Scope {
        if self.host_accounts {
            Scope::Host
        } else {
            Scope::Shared
        }
    }

    /// The shared stream and bucket (without per-host accounts).
    pub(super) async fn shared(&self) -> Result<&Storage, FleetError> {
        self.shared
            .get_or_try_init(|| async {
                let js = jetstream::new(self.client.clone());
                open(&js, self.retention, Scope::Shared).await
            })
            .await
    }

    /// `host`'s stream and bucket.
    pub(super) async fn of(&self, host: &str) -> Result<Storage, FleetError> {
        if !self.host_accounts {
            return self.shared().await.cloned();
        }
        let cell = {
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(hosts.entry(host.to_string()).or_default())
        };
        cell.get_or_try_init(|| self.open_host(host)).await.cloned()
    }

    async fn open_host(&self, host: &str) -> Result<Storage, FleetError> {
        let prefix = nats_layout::store_api_prefix(host);
        // Whether the host has a storage account at all: its JetStream answers
        // account info; nothing answers for a host the server config lacks.
        match self
            .client
            .request(format!("{prefix}.INFO"), "".into())
            .await
        {
            Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                return Err(FleetError::NoHostAccount(host.to_string()))
            }
            Err(e) => return Err(FleetError::nats(e)),
            Ok(_) => {}
        }
        let js = jetstream::with_prefix(self.client.clone(), &prefix);
        // Two hosts of a new shard opened side by side may both find its streams
        // missing and both make them: the second make fails, and a second open finds
        // them there.
        let storage = match open(&js, self.retention, Scope::Host).await {
            Ok(s) => s,
            Err(_) => open(&js, self.retention, Scope::Host).await?,
        };
        cnats::migrate_host(&js, self.retention.replicas, &storage.evt, &storage.results).await?;
        Ok(storage)
    }
}

async fn open(
    js: &jetstream::Context,
    retention: Retention,
    scope: Scope,
) -> Result<Storage, FleetError> {
    let replicas = retention.replicas;
    let evt = cnats::evt_stream(js, replicas, scope).await?;
    let results = cnats::results_stream(js, retention.commands_max_age, replicas, scope).await?;
    Ok(Storage { evt, results })
}
