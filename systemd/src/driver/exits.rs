//! When a unit's state change is an exit of its workload: what the driver reports as
//! `workload_exited` (pure; `docs/systemd.md`, *Exits*).

/// Whether a unit going from `before` (its last state seen; `None`: never seen) to
/// `active_state`/`sub_state` is an exit: leaving `active`/`deactivating`/`reloading`
/// for `inactive`, `failed` or an `auto-restart`, or arriving in `failed` (systemd
/// gave up) from anything else. Repeated signals of one state are not new exits.
pub(super) fn is_exit(before: Option<&str>, active_state: &str, sub_state: &str) -> bool {
    let was_up = before.is_some_and(|s| matches!(s, "active" | "deactivating" | "reloading"));
    match active_state {
        "failed" => before != Some("failed"),
        "inactive" => was_up,
        "activating" => was_up && sub_state == "auto-restart",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::is_exit;

    #[test]
    fn a_crash_loop_is_one_exit_per_crash_and_one_when_systemd_gives_up() {
        // What systemd 252 signals for a unit that exits 3 with Restart=on-failure,
        // until its start limit (seen on a real one).
        let signals = [
            ("inactive", "dead"),
            ("activating", "start"),
            ("active", "running"),
            ("failed", "failed"),
            ("activating", "auto-restart"),
            ("inactive", "dead"),
            ("activating", "start"),
            ("active", "running"),
            ("active", "running"),
            ("failed", "failed"),
            ("activating", "auto-restart"),
            ("inactive", "dead"),
            ("failed", "failed"),
            ("failed", "failed"),
        ];
        let mut before: Option<&str> = None;
        let exits: Vec<usize> = signals
            .iter()
            .enumerate()
            .filter_map(|(i, (active, sub))| {
                let exit = is_exit(before, active, sub);
                before = Some(active);
                exit.then_some(i)
            })
            .collect();
        assert_eq!(exits, [3, 9, 12]);
    }

    #[test]
    fn a_stop_is_an_exit_and_a_unit_never_seen_up_is_not() {
        assert!(is_exit(Some("deactivating"), "inactive", "dead"));
        assert!(is_exit(Some("active"), "activating", "auto-restart"));
        assert!(!is_exit(None, "inactive", "dead"));
        assert!(!is_exit(Some("inactive"), "inactive", "dead"));
        assert!(!is_exit(Some("active"), "activating", "start"));
        assert!(is_exit(None, "failed", "failed"));
    }
}
