//! Which storage shard (`SHARD_<n>`) holds each host's records and results, kept in
//! `<out>/shards` across runs of `nats-config`: a host stays in its shard for as long
//! as it is listed (its audit copy is there), a new host goes to the lowest shard with
//! room, a host no longer listed frees its place.
//!
//! The file is one `<host> <shard>` a line, `#` comments; an operator may edit it (to
//! move a host to a shard of its own, say): the next run keeps what it says.

use super::NatsConfError;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The shards file of an output directory.
pub fn shards_file(out: &Path) -> PathBuf {
    out.join("shards")
}

/// The assignments in a shards file's text.
pub fn parse(path: &Path, text: &str) -> Result<BTreeMap<String, u32>, NatsConfError> {
    let mut kept = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = || NatsConfError::ShardsLine {
            path: path.to_path_buf(),
            line: n + 1,
        };
        let mut words = line.split_whitespace();
        let (Some(host), Some(shard), None) = (words.next(), words.next(), words.next()) else {
            return Err(bad());
        };
        let shard = shard.parse::<u32>().map_err(|_| bad())?;
        if kept.insert(host.to_string(), shard).is_some() {
            return Err(bad());
        }
    }
    Ok(kept)
}

/// Each of `hosts`' shard, in order: the one `kept` gives it, else the lowest shard
/// holding fewer than `per_shard` of `hosts`.
pub fn assign(kept: &BTreeMap<String, u32>, hosts: &[String], per_shard: u32) -> Vec<u32> {
    let mut load: BTreeMap<u32, u32> = BTreeMap::new();
    for h in hosts {
        if let Some(&s) = kept.get(h) {
            *load.entry(s).or_default() += 1;
        }
    }
    hosts
        .iter()
        .map(|h| {
            kept.get(h).copied().unwrap_or_else(|| {
                let shard = (0..)
                    .find(|s| load.get(s).copied().unwrap_or(0) < per_shard)
                    .expect("a shard with room");
                *load.entry(shard).or_default() += 1;
                shard
            })
        })
        .collect()
}

/// The shards file's text for `hosts` and their shards.
pub fn render(hosts: &[(&str, u32)]) -> String {
    let mut out = String::from(
        "# Each host's storage shard (account SHARD_<n>), kept by `capstan-coordinator\n\
         # nats-config` across runs: `<host> <shard>` a line. Edit a line to move a host\n\
         # (docs/nats.md, \"Storage shards\"), then run nats-config again.\n",
    );
    for (host, shard) in hosts {
        let _ = writeln!(out, "{host} {shard}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn new_hosts_fill_the_lowest_shard_with_room_and_kept_ones_stay() {
        let none = BTreeMap::new();
        assert_eq!(
            assign(&none, &names(&["a", "b", "c", "d", "e"]), 2),
            [0, 0, 1, 1, 2]
        );
        // b removed, f added: f takes b's place; the others do not move.
        let kept = BTreeMap::from([
            ("a".into(), 0),
            ("b".into(), 0),
            ("c".into(), 1),
            ("d".into(), 1),
            ("e".into(), 2),
        ]);
        assert_eq!(
            assign(&kept, &names(&["a", "c", "d", "e", "f", "g"]), 2),
            [0, 1, 1, 2, 0, 2]
        );
        // A host moved by hand to a shard of its own stays there, over-full or not.
        let moved = BTreeMap::from([("a".into(), 7), ("b".into(), 0)]);
        assert_eq!(assign(&moved, &names(&["a", "b", "c"]), 1), [7, 0, 1]);
    }

    #[test]
    fn the_file_reads_back_what_it_wrote_and_refuses_junk() {
        let path = Path::new("/x/shards");
        let text = render(&[("h1", 0), ("web-2", 3)]);
        assert_eq!(
            parse(path, &text).unwrap(),
            BTreeMap::from([("h1".into(), 0), ("web-2".into(), 3)])
        );
        for (bad, line) in [
            ("h1\n", 1),
            ("h1 0\nh2 x\n", 2),
            ("h1 0 1\n", 1),
            ("h1 0\nh1 1\n", 2),
            ("# c\n\nh1 -1\n", 3),
        ] {
            match parse(path, bad) {
                Err(NatsConfError::ShardsLine { line: l, .. }) => assert_eq!(l, line, "{bad:?}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
