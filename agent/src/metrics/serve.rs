//! `GET /metrics` over HTTP on the `[metrics] listen` address (axum, on the agent's
//! runtime). The listener is bound by [`bind`] before the agent opens anything, so
//! that an address in use stops the start with an error naming it; it answers once
//! the agent is up ([`serve`]).

use super::render::{self, Gauges};
use super::Metrics;
use crate::log::Log;
use axum::http::header;
use axum::response::IntoResponse;
use capstan_common::DriverKind;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument as _;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen for /metrics on {addr} (`[metrics] listen`; `enabled = false` turns the endpoint off)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// What a scrape reads: the counters, and the log and driver the gauges come from.
#[derive(Clone)]
pub struct Scrape {
    pub metrics: Arc<Metrics>,
    pub log: Arc<Log>,
    pub driver: DriverKind,
    /// The outbox's acknowledged seq, with `[nats]`.
    pub published: Option<watch::Receiver<u64>>,
}

impl Scrape {
    fn gauges(&self) -> Gauges {
        let log = &self.log;
        Gauges {
            last_seq: log.last_seq(),
            published_seq: self.published.as_ref().map(|p| *p.borrow()),
            degraded: !log.healthy(),
            workloads: log.with_intent(super::workloads),
            version: env!("CARGO_PKG_VERSION"),
            driver: self.driver,
        }
    }
}

async fn metrics(axum::extract::State(scrape): axum::extract::State<Scrape>) -> impl IntoResponse {
    let text = render::render(&scrape.metrics, &scrape.gauges());
    ([(header::CONTENT_TYPE, render::CONTENT_TYPE)], text)
}

/// Serves `GET /metrics` on `listener`, from what `scrape` reads, until `stop` is
/// cancelled.
pub fn serve(
    listener: TcpListener,
    scrape: Scrape,
    stop: tokio_util::sync::CancellationToken,
) -> JoinHandle<()> {
    let addr = listener.local_addr().ok();
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .with_state(scrape);
    tokio::spawn(
        async move {
            if let Some(addr) = addr {
                tracing::info!(%addr, "serving metrics on http://{addr}/metrics");
            }
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the metrics endpoint failed");
            }
        }
        .in_current_span(),
    )
}
