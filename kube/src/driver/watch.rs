//! What the kube driver learns from watches rather than by polling: a rollout's
//! progress, container restarts (exits) and failures of our workloads. Every watch is
//! kube-runtime's watcher, which lists, then watches, and resumes with backoff after a
//! disconnect or an apiserver restart (from its last resource version, or with a new
//! list when that is too old).

use super::KubeDriver;
use crate::objects::{self, Reported, Rollout, Watched};
use capstan_common::ErrorCode;
use capstan_driver::{DriverError, Exit, Failure, RevisionRef};
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{reflector, WatchStreamExt as _};
use kube::{Api, ResourceExt as _};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc::Sender;

/// An event of one of two watches merged: Deployments and pods (boxed: a watcher
/// event holds whole objects).
enum Seen {
    Deployment(Box<watcher::Event<Deployment>>),
    Pod(Box<watcher::Event<Pod>>),
}

impl Seen {
    /// `deployments` or `pods` when this event ends a (re)list of that watch.
    fn listed(&self) -> Option<&'static str> {
        match self {
            Seen::Deployment(e) if matches!(**e, watcher::Event::InitDone) => Some("deployments"),
            Seen::Pod(e) if matches!(**e, watcher::Event::InitDone) => Some("pods"),
            _ => None,
        }
    }
}

impl KubeDriver {
    /// The Deployments and pods `deployments` and `pods` select, watched together.
    fn watch(
        &self,
        deployments: (Api<Deployment>, watcher::Config),
        pods: (Api<Pod>, watcher::Config),
    ) -> impl Stream<Item = Result<Seen, watcher::Error>> + Send + 'static {
        let d = watcher(deployments.0, deployments.1)
            .default_backoff()
            .map(|e| e.map(|e| Seen::Deployment(Box::new(e))));
        let p = watcher(pods.0, pods.1)
            .default_backoff()
            .map(|e| e.map(|e| Seen::Pod(Box::new(e))));
        futures::stream::select(d, p)
    }

    /// Waits (at most `rollout_timeout_secs`) for `rev`'s rollout to complete, from a
    /// watch of its Deployment and of its pods, failing on what the cluster will not
    /// get past by itself.
    pub(super) async fn wait_rollout(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<(), DriverError> {
        let seconds = self.config.rollout_timeout_secs;
        let name = objects::deployment_name(rev.workload);
        let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let of_rev = watcher::Config::default().labels(&self.pods_selector(rev));
        let pods = Api::namespaced(self.client.clone(), rev.namespace);
        let events = self.watch((self.deployments(rev.namespace), by_name), (pods, of_rev));
        let mut last = None;
        let followed = follow_rollout(op, rev, events, &mut last);
        match tokio::time::timeout(Duration::from_secs(seconds.into()), followed).await {
            Ok(done) => done,
            Err(_) => Err(DriverError::refused(
                op,
                rev,
                ErrorCode::RolloutTimeout,
                format!("the rollout did not complete in {seconds} s ({last:?})"),
            )),
        }
    }

    /// Container restarts of our pods, from a watch of them.
    pub(super) async fn exits(&self, exits: Sender<Exit>) -> Result<(), DriverError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().labels(&self.selector());
        let events = watcher(pods, config).default_backoff().applied_objects();
        futures::pin_mut!(events);
        let mut seen = BTreeMap::new();
        loop {
            let pod = tokio::select! {
                // Cancel-safe: a closed receiver ends the watch; nothing is lost.
                () = exits.closed() => return Ok(()),
                pod = events.next() => pod,
            };
            let pod = match pod {
                Some(Ok(pod)) => pod,
                Some(Err(e)) => {
                    tracing::warn!(target: "capstan::kube", error = %e, "pod watch interrupted; resuming");
                    continue;
                }
                None => return Ok(()),
            };
            for exit in objects::exits_of(&pod, &mut seen) {
                if exits.send(exit).await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    /// Failures of our Deployments (a rollout the cluster gave up on) and pods (an
    /// image that cannot be pulled, a crash loop), from a watch of both: each sent
    /// once while its object shows it (again after a new list).
    pub(super) async fn failures(&self, failures: Sender<Failure>) -> Result<(), DriverError> {
        let ours = watcher::Config::default().labels(&self.selector());
        let events = self.watch(
            (Api::all(self.client.clone()), ours.clone()),
            (Api::all(self.client.clone()), ours),
        );
        futures::pin_mut!(events);
        let (mut deployments, mut pods) = (Reported::default(), Reported::default());
        loop {
            let event = tokio::select! {
                // Cancel-safe: a closed receiver ends the watch; nothing is lost.
                () = failures.closed() => return Ok(()),
                event = events.next() => event,
            };
            if let Some(Ok(seen)) = &event {
                if let Some(watch) = seen.listed() {
                    // From here on every change of those objects reaches this loop
                    // (said so that an operator, or a test, knows the watch holds).
                    tracing::info!(target: "capstan::kube", watch, "failure watch listed");
                }
            }
            let failure = match event {
                Some(Ok(Seen::Deployment(e))) => {
                    failure_of(&mut deployments, *e, |d| Watched::Deployment(d).failure())
                }
                Some(Ok(Seen::Pod(e))) => failure_of(&mut pods, *e, |p| Watched::Pod(p).failure()),
                Some(Err(e)) => {
                    tracing::warn!(target: "capstan::kube", error = %e, "failure watch interrupted; resuming");
                    continue;
                }
                None => return Ok(()),
            };
            if let Some(failure) = failure {
                if failures.send(failure).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// What one watch event of an object says about failures not sent yet.
fn failure_of<K: kube::Resource>(
    reported: &mut Reported,
    event: watcher::Event<K>,
    failure: impl Fn(&K) -> Option<Failure>,
) -> Option<Failure> {
    let key = |o: &K| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            reported.update(key(&o), failure(&o))
        }
        watcher::Event::Delete(o) => {
            reported.forget(&key(&o));
            None
        }
        watcher::Event::Init => {
            reported.clear();
            None
        }
        watcher::Event::InitDone => None,
    }
}

/// Follows a rollout's Deployment and pods until it completes or fails; `last` is
/// where it stood last.
async fn follow_rollout(
    op: &'static str,
    rev: RevisionRef<'_>,
    events: impl Stream<Item = Result<Seen, watcher::Error>>,
    last: &mut Option<Rollout>,
) -> Result<(), DriverError> {
    futures::pin_mut!(events);
    let (deployment, mut deployment_writer) = reflector::store::<Deployment>();
    let (pods, mut pods_writer) = reflector::store::<Pod>();
    // Whether the Deployment was listed once: before that, absent means not known yet.
    let mut listed = false;
    // 403s in a row: a few are a permission missing, not an apiserver starting up.
    let mut refused = 0;
    while let Some(event) = events.next().await {
        refused = if event.as_ref().is_err_and(forbidden) {
            refused + 1
        } else {
            0
        };
        match event {
            Ok(Seen::Deployment(e)) => {
                listed |= matches!(*e, watcher::Event::InitDone);
                deployment_writer.apply_watcher_event(&e);
            }
            Ok(Seen::Pod(e)) => pods_writer.apply_watcher_event(&e),
            Err(e) if refused >= FORBIDDEN_AFTER => {
                let message = e.to_string();
                return Err(DriverError::refused(op, rev, ErrorCode::Forbidden, message));
            }
            Err(e) => {
                tracing::warn!(target: "capstan::kube", %rev, error = %e, "rollout watch interrupted; resuming");
                continue;
            }
        }
        if !listed {
            continue;
        }
        let Some(live) = deployment.state().pop() else {
            return Err(DriverError::Missing {
                op,
                target: rev.to_string(),
            });
        };
        let state = objects::rollout(&live, rev.revision);
        match &state {
            Rollout::Complete => return Ok(()),
            Rollout::Failed { reason } => {
                return Err(DriverError::refused(
                    op,
                    rev,
                    ErrorCode::BackendFailed,
                    format!("the rollout failed: {reason}"),
                ))
            }
            Rollout::Superseded => {
                return Err(DriverError::refused(
                    op,
                    rev,
                    ErrorCode::DriverFailed,
                    "the Deployment moved to another revision during the rollout",
                ))
            }
            Rollout::Progressing { .. } => {}
        }
        if let Some((code, reason)) = objects::pod_failure(pods.state().iter().map(|p| &**p)) {
            return Err(DriverError::refused(op, rev, code, reason));
        }
        if last.as_ref() != Some(&state) {
            tracing::info!(target: "capstan::kube", %rev, ?state, "rollout");
            *last = Some(state);
        }
    }
    // A watcher's stream does not end; if it did, nothing more can be learnt.
    Err(DriverError::Unavailable {
        op,
        target: rev.to_string(),
        source: "the rollout watch ended".into(),
    })
}

/// How many 403s in a row from the rollout's watches fail it `forbidden`. Not the
/// first: an apiserver that has just started answers 403 for a moment, until its
/// authorizer has read the roles (seen after a restart in
/// `kube::driver::an_apiserver_restart_mid_rollout_…`). With the watcher's backoff
/// (0.8 s doubling) three take about 5 s.
const FORBIDDEN_AFTER: u32 = 3;

/// Whether the apiserver refused a watch (403): a permission missing, or one not
/// known yet; every other error is resumed from (a disconnect, an expired resource
/// version).
fn forbidden(e: &watcher::Error) -> bool {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => s,
        _ => return false,
    };
    status.code == 403
}
