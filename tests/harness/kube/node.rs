//! The node stand-in: the cluster has no kubelet, so the harness plays one for every
//! pod, as kwok does. It watches pods (kube-runtime's watcher, resumed after the
//! apiserver goes away) and writes the status a kubelet would through the pods'
//! `status` subresource. What it writes is decided by [`status_for`] from the pod's
//! first image and whether its first container has a readinessProbe, so tests can ask
//! for failures and for pods that become ready late or never:
//!
//! | image contains | phase | first container |
//! |---|---|---|
//! | `missing` | Pending | waiting `ErrImagePull`, not ready |
//! | `crashloop` | Running | waiting `CrashLoopBackOff`, 5 restarts, not ready |
//! | `pending` | (none written: a rollout that waits until the test plays the kubelet) | |
//! | `unready` | Running | running, never ready (a readinessProbe that never passes) |
//! | anything else, with a readinessProbe | Running | running, not ready; then, `initialDelaySeconds + periodSeconds × successThreshold` s later, ready |
//! | anything else | Running | running, ready |
//!
//! Each outcome is written once: a pod that has a `Ready` condition is not written
//! again on its events (so the stand-in's own writes never feed back into more), and
//! the late `ready` of a probed pod is written by a timer set when its first status
//! was, as a kubelet's probes would find it.
//!
//! Pods are never bound to a node: an unbound pod is deleted at once (no kubelet has to
//! confirm it), which is what scale-downs and retires need here.

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Probe};
use kube::api::{Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{json, Value};
use std::time::Duration;

/// What the stand-in makes of a pod's first container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ready,
    ImagePullError,
    CrashLoop,
    /// Never reported: the test writes its status.
    Pending,
    /// Running, and its readiness never passes.
    Unready,
    /// Running, not ready until its readinessProbe has passed `successThreshold`
    /// times: ready after this long.
    ReadyAfter(Duration),
}

impl Outcome {
    /// From the image alone (no readinessProbe).
    pub fn of(image: &str) -> Outcome {
        if image.contains("missing") {
            Outcome::ImagePullError
        } else if image.contains("crashloop") {
            Outcome::CrashLoop
        } else if image.contains("pending") {
            Outcome::Pending
        } else if image.contains("unready") {
            Outcome::Unready
        } else {
            Outcome::Ready
        }
    }

    /// From the pod's first container: its image, then its readinessProbe (a pod
    /// that would be ready is ready only once the probe has passed).
    pub fn of_pod(pod: &Pod) -> Option<Outcome> {
        let c = pod.spec.as_ref()?.containers.first()?;
        let outcome = Outcome::of(c.image.as_deref().unwrap_or_default());
        Some(match (outcome, &c.readiness_probe) {
            (Outcome::Ready, Some(probe)) => Outcome::ReadyAfter(ready_after(probe)),
            _ => outcome,
        })
    }
}

/// When a kubelet would first find a pod ready under `probe`: after its initial delay,
/// `successThreshold` probes `periodSeconds` apart (the API's defaults: 0, 10 s, 1).
pub fn ready_after(probe: &Probe) -> Duration {
    let seconds = |n: Option<i32>, default: i32| u64::try_from(n.unwrap_or(default)).unwrap_or(0);
    let delay = seconds(probe.initial_delay_seconds, 0);
    let period = seconds(probe.period_seconds, 10);
    let threshold = seconds(probe.success_threshold, 1);
    Duration::from_secs(delay + period * threshold)
}

/// The status to write for `pod` at `now` (RFC 3339), or `None` when it has one
/// already (or is being deleted): the stand-in writes each pod once, so its own writes
/// do not feed back into more writes and a test may play what happens next. A probed
/// pod's first status is not ready; [`run`] writes its ready one later.
pub fn status_for(pod: &Pod, now: &str) -> Option<Value> {
    status_as(pod, Outcome::of_pod(pod)?, now)
}

/// The status a kubelet writes for a ready pod, at `now`: for a test playing the
/// kubelet of a `pending` pod.
pub fn ready_status(pod: &Pod, now: &str) -> Option<Value> {
    status_as(pod, Outcome::Ready, now)
}

fn status_as(pod: &Pod, outcome: Outcome, now: &str) -> Option<Value> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let current_ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status == "True");
    // Written once, as a kubelet's first report: what happens to the pod later (a
    // test playing a crash) is left alone.
    if current_ready.is_some() {
        return None;
    }
    written_as(pod, outcome, now)
}

/// A probed pod's status once its readinessProbe has passed, at `now`: ready, over
/// the not-ready status the stand-in wrote first; `None` for a pod being deleted.
pub fn probed_ready_status(pod: &Pod, now: &str) -> Option<Value> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    written_as(pod, Outcome::Ready, now)
}

/// The status a kubelet reports for `pod` in `outcome`, at `now`.
fn written_as(pod: &Pod, outcome: Outcome, now: &str) -> Option<Value> {
    let spec = pod.spec.as_ref()?;
    let (phase, ready) = match outcome {
        Outcome::Pending => return None,
        Outcome::Ready => ("Running", true),
        Outcome::ImagePullError => ("Pending", false),
        Outcome::CrashLoop => ("Running", false),
        Outcome::Unready | Outcome::ReadyAfter(_) => ("Running", false),
    };
    let running = matches!(
        outcome,
        Outcome::Ready | Outcome::Unready | Outcome::ReadyAfter(_)
    );
    let truth = |b: bool| if b { "True" } else { "False" };
    let condition = |type_: &str, status: bool| json!({"type": type_, "status": truth(status), "lastTransitionTime": now});
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            let (state, restarts) = match outcome {
                Outcome::Ready | Outcome::Pending | Outcome::Unready | Outcome::ReadyAfter(_) => {
                    (json!({"running": {"startedAt": now}}), 0)
                }
                Outcome::ImagePullError => (
                    json!({"waiting": {"reason": "ErrImagePull",
                        "message": format!("failed to pull image {image:?}: not found")}}),
                    0,
                ),
                Outcome::CrashLoop => (
                    json!({"waiting": {"reason": "CrashLoopBackOff",
                        "message": format!("back-off restarting failed container {}", c.name)}}),
                    5,
                ),
            };
            json!({
                "name": c.name,
                "image": image,
                "imageID": "",
                "ready": ready,
                "started": running,
                "restartCount": restarts,
                "state": state,
            })
        })
        .collect();
    Some(json!({
        "status": {
            "phase": phase,
            "startTime": now,
            "conditions": [
                condition("PodScheduled", true),
                condition("Initialized", true),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "containerStatuses": containers,
        }
    }))
}

/// Plays the kubelet for every pod of the cluster until aborted.
pub async fn run(client: Client) {
    let pods: Api<Pod> = Api::all(client.clone());
    let events = watcher(pods, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    futures::pin_mut!(events);
    // The writes in progress, aborted with this task.
    let mut writes = tokio::task::JoinSet::new();
    while let Some(pod) = events.next().await {
        while writes.try_join_next().is_some() {}
        // Errors are retried by the watcher's backoff (the apiserver may be restarting).
        let Ok(pod) = pod else { continue };
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let Some(status) = status_for(&pod, &now) else {
            continue;
        };
        let Some(ns) = pod.namespace() else { continue };
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        // Retried on its own task: a pod gets no new event when the write is lost to
        // an apiserver going away, so the stand-in must not leave it unwritten.
        let name = pod.name_any();
        let later = match Outcome::of_pod(&pod) {
            Some(Outcome::ReadyAfter(after)) => Some(after),
            _ => None,
        };
        writes.spawn(async move {
            write_status(api.clone(), name.clone(), status).await;
            // The kubelet's probes passing: a timer, not an event of the pod.
            if let Some(after) = later {
                tokio::time::sleep(after).await;
                let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                if let Some(ready) = probed_ready_status(&pod, &now) {
                    write_status(api, name, ready).await;
                }
            }
        });
    }
}

/// Writes `status` to pod `name`, retrying (0.1 s doubling to 2 s) while the
/// apiserver cannot take it; stops when the pod is gone or the apiserver refuses the
/// write itself (a conflict with the controllers: the next event for the pod brings
/// it back to [`run`]).
async fn write_status(api: Api<Pod>, name: String, status: Value) {
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code < 500 && e.code != 429 => return,
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
        }
    }
}
