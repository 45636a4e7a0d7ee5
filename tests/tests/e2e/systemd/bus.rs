//! The D-Bus connection itself ([`capstan_systemd::bus::Bus`]) against a real systemd:
//! what the driver's streams must never do to the connection.

use capstan_systemd::bus::Bus;
use capstan_tests::systemd::SystemdHost;
use capstan_tests::READY;
use std::time::Duration;

/// How many short-lived units (named like ours) the burst starts: each one's start and end are several
/// `PropertiesChanged` signals, together far more than zbus queues for one stream (64).
const BURST: usize = 40;

/// zbus reads nothing more from the socket while a stream's queue is full: a watch of
/// unit changes that its owner does not read at that moment (the driver's exit feed
/// awaits `list_ours` right after opening it; an agent restarted while systemd still
/// works through a reload or the jobs of the one it replaced gets a burst then) must
/// not block the replies to every other call of the connection. Found by
/// `systemd::crash_loop`: a restarted agent hung for good in its first D-Bus calls.
#[test]
fn a_watch_left_unread_during_a_burst_of_changes_never_blocks_other_calls() {
    let host = SystemdHost::boot();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let bus = rt
        .block_on(Bus::connect(
            Some(&host.bus_address()),
            Duration::from_secs(90),
        ))
        .expect("connect");
    let unread = rt.block_on(bus.watch()).expect("watch");
    for n in 0..BURST {
        let unit = format!("capstan-burst-{n}");
        let out = host.nsenter(&[
            "systemd-run",
            "--quiet",
            "--wait",
            "--collect",
            "--unit",
            &unit,
            "true",
        ]);
        assert!(out.status.success(), "{unit}: {out:?}");
    }
    // Every signal of the burst was sent before this call: its reply comes behind
    // them. (The timeout only turns a hang into a failure.)
    let version = rt
        .block_on(async { tokio::time::timeout(READY, bus.version()).await })
        .expect("the call's reply was read behind the unread signals")
        .expect("Version");
    assert!(!version.is_empty());
    // And the burst was one: more changes than zbus queues reached the watch.
    let counted = rt
        .block_on(async {
            use futures::StreamExt as _;
            tokio::time::timeout(READY, unread.take(65).count()).await
        })
        .expect("more than 64 changes reached the watch");
    assert_eq!(counted, 65);
}
