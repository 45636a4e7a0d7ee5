//! What happened to one command, as its host's records tell it. The agent writes it
//! (its entry in the `capstan_results` bucket, see [`crate::nats_layout::result_key`]) and
//! the coordinator answers it (`GET /v1/commands/{id}`), so both sum the records up
//! the same way: here.

use crate::ErrorCode;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A command's state: `pending` (not yet received), `running`, `succeeded`, `failed`
/// or `rejected`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandStatus {
    pub id: String,
    pub host: String,
    pub status: String,
    /// True once the status is final.
    pub done: bool,
    /// `{code, message, retryable}` of a failure or rejection: `retryable` is
    /// [`ErrorCode::is_retryable`] of the code (false for a code this build does not
    /// know); entries written before it existed carry only `code` and `message`.
    pub error: Option<Value>,
    /// Every record carrying the command's id, in log order (their `CAPSTAN_EVT`
    /// form: the record's JSON plus `host`). Read as none when absent.
    #[serde(default)]
    pub events: Vec<Value>,
    /// In a bucket entry only: the events were left out because they did not fit in
    /// one entry ([`MAX_EVENTS_BYTES`]); they are the records of the host with this
    /// command's id from `first_seq` to `last_seq`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub events_truncated: bool,
    /// The seq of the command's first and last record summed up (0 when none).
    #[serde(default)]
    pub first_seq: u64,
    #[serde(default)]
    pub last_seq: u64,
}

/// The most bytes of events a bucket entry carries; past it they are left out
/// (`events_truncated`). Below the bucket's largest message
/// ([`crate::nats::RESULT_MAX_BYTES`] with feature `nats`).
pub const MAX_EVENTS_BYTES: usize = 480 * 1024;

impl CommandStatus {
    /// The status of a command with no records yet.
    pub fn pending(id: &str, host: &str) -> CommandStatus {
        summarize(id, host, Vec::new())
    }

    /// Leaves the events out when they take more than `max_bytes` of JSON.
    pub fn fit(mut self, max_bytes: usize) -> CommandStatus {
        let size: usize = self.events.iter().map(|e| e.to_string().len() + 1).sum();
        if size > max_bytes {
            self.events.clear();
            self.events_truncated = true;
        }
        self
    }
}

/// A command's status from its events (every record carrying its id), in log order.
pub fn summarize(id: &str, host: &str, events: Vec<Value>) -> CommandStatus {
    let mut status = "pending";
    let mut error = None;
    let mut completed = false;
    for e in &events {
        let err = || {
            e.get("code").filter(|c| !c.is_null()).map(|c| {
                let retryable = ErrorCode::deserialize(c).is_ok_and(ErrorCode::is_retryable);
                json!({"code": c, "message": e["message"], "retryable": retryable})
            })
        };
        match e["kind"].as_str() {
            Some("command_received") if !completed => status = "running",
            Some("command_completed") => {
                completed = true;
                status = match e["outcome"].as_str() {
                    Some("succeeded") => "succeeded",
                    Some("rejected") => "rejected",
                    _ => "failed",
                };
                error = err();
            }
            // After `command_received` a rejection is of a replay (an expired
            // re-send, another command reusing the id: `id_conflict`), not of this one.
            Some("command_rejected") if status == "pending" => {
                status = "rejected";
                error = err();
            }
            _ => {}
        }
    }
    let seq = |e: Option<&Value>| e.and_then(|e| e["seq"].as_u64()).unwrap_or(0);
    CommandStatus {
        id: id.to_string(),
        host: host.to_string(),
        done: matches!(status, "succeeded" | "failed" | "rejected"),
        status: status.to_string(),
        error,
        first_seq: seq(events.first()),
        last_seq: seq(events.last()),
        events,
        events_truncated: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(s: &CommandStatus) -> (&str, bool) {
        (s.status.as_str(), s.done)
    }

    #[test]
    fn completion_wins_over_a_later_rejection_of_a_replay() {
        let events = vec![
            json!({"seq": 4, "kind":"command_received","command_id":"a"}),
            json!({"seq": 5, "kind":"command_completed","command_id":"a","outcome":"succeeded","code":null}),
            json!({"seq": 9, "kind":"command_rejected","command_id":"a","code":"expired","message":"old"}),
        ];
        let s = summarize("a", "h1", events);
        assert_eq!(status(&s), ("succeeded", true));
        assert!(s.error.is_none());
        assert_eq!((s.first_seq, s.last_seq), (4, 9));
    }

    #[test]
    fn a_reused_id_rejected_while_the_first_runs_does_not_end_it() {
        let events = vec![
            json!({"kind":"command_received","command_id":"a"}),
            json!({"kind":"command_rejected","command_id":"a","code":"id_conflict","message":"m"}),
        ];
        let s = summarize("a", "h1", events);
        assert_eq!(status(&s), ("running", false));
        assert!(s.error.is_none());
        let alone = vec![json!({"kind":"command_rejected","code":"id_conflict","message":"m"})];
        let s = summarize("a", "h1", alone);
        assert_eq!(status(&s), ("rejected", true));
        assert_eq!(s.error.unwrap()["code"], "id_conflict");
    }

    #[test]
    fn statuses_follow_the_events() {
        assert_eq!(
            status(&CommandStatus::pending("a", "h")),
            ("pending", false)
        );
        let running = vec![json!({"kind":"command_received"})];
        let s = summarize("a", "h", running);
        assert_eq!(status(&s), ("running", false));
        let rejected = vec![json!({"kind":"command_rejected","code":"unsigned","message":"m"})];
        let s = summarize("a", "h", rejected);
        assert_eq!(status(&s), ("rejected", true));
        assert_eq!(s.error.unwrap()["code"], "unsigned");
        let failed = vec![
            json!({"kind":"command_completed","outcome":"failed","code":"namespace_not_found","message":"m"}),
        ];
        assert_eq!(summarize("a", "h", failed).status, "failed");
    }

    /// Given a failure whose code is retryable, one whose code is not, a rejection and
    /// a code this build does not know, when summed up, then the error carries
    /// `retryable` as `ErrorCode::is_retryable` says (false for the unknown code).
    #[test]
    fn the_error_says_whether_a_new_id_may_succeed() {
        let failed = |code: &str| {
            vec![
                json!({"seq": 1, "kind":"command_received","command_id":"a"}),
                json!({"seq": 2, "kind":"command_completed","command_id":"a","outcome":"failed",
                    "code": code, "message":"m"}),
            ]
        };
        let s = summarize("a", "h", failed("hook_failed"));
        assert_eq!(status(&s), ("failed", true));
        assert_eq!(
            s.error,
            Some(json!({"code": "hook_failed", "message": "m", "retryable": true}))
        );
        let s = summarize("a", "h", failed("namespace_not_found"));
        assert_eq!(
            s.error,
            Some(json!({"code": "namespace_not_found", "message": "m", "retryable": false}))
        );
        let s = summarize("a", "h", failed("no_such_code_yet"));
        assert_eq!(s.error.unwrap()["retryable"], false);
        let rejected = vec![json!({"kind":"command_rejected","code":"expired","message":"old"})];
        let s = summarize("a", "h", rejected);
        assert_eq!(
            s.error,
            Some(json!({"code": "expired", "message": "old", "retryable": false}))
        );
        let succeeded = vec![
            json!({"kind":"command_completed","outcome":"succeeded","code":null,"message":null}),
        ];
        assert_eq!(summarize("a", "h", succeeded).error, None);
    }

    #[test]
    fn events_that_do_not_fit_are_left_out_and_said_so() {
        let events = vec![json!({"seq": 1, "kind":"command_received","command": "x".repeat(100)})];
        let whole = summarize("a", "h", events.clone()).fit(1000);
        assert!(!whole.events_truncated);
        assert_eq!(whole.events, events);
        let cut = summarize("a", "h", events).fit(50);
        assert!(cut.events_truncated && cut.events.is_empty());
        assert_eq!((cut.first_seq, cut.last_seq), (1, 1));
        // The flag is on the wire only when set.
        let json = serde_json::to_value(&whole).unwrap();
        assert!(json.get("events_truncated").is_none(), "{json}");
        let back: CommandStatus =
            serde_json::from_value(serde_json::to_value(&cut).unwrap()).unwrap();
        assert_eq!(back, cut);
    }
}
