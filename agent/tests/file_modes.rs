//! What the agent writes has the mode its code chose, never the umask's: the data
//! dir and the log's directory `0700` (one an earlier build left open is closed), the
//! host key `0600` in `0700` directories, export files `0600` (retention's and `log
//! export -o`'s), the sim driver's state `0600`, systemd unit files `0644` and env
//! drop-ins `0600`. One test, in a binary of its own: the umask is the whole
//! process's (and the agent's children inherit it), so nothing else may run beside it.

use capstan_agent::log::export;
use nix::sys::stat::{umask, Mode};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

fn mode(path: &Path) -> u32 {
    let meta = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    meta.permissions().mode() & 0o7777
}

fn assert_mode(path: &Path, want: u32, umask: u32) {
    assert_eq!(
        format!("{:04o}", mode(path)),
        format!("{want:04o}"),
        "{} under umask {umask:04o}",
        path.display()
    );
}

/// `capstan-agent` with `args`, as an operator runs it (the umask inherited).
fn agent(config: &Path, data: &Path, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_capstan-agent"))
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .args(["--host", "h1"])
        .args(args)
        .output()
        .expect("run capstan-agent");
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn check(mask: u32) {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("agent.toml");
    std::fs::write(&config, "").unwrap();
    let input = tmp.path().join("commands.jsonl");
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    std::fs::write(
        &input,
        format!(
            r#"{{"v":1,"id":"modes-1","host":"h1","issued_at":"{now}","op":"ensure_namespace","namespace":"shop"}}"#
        ) + "\n",
    )
    .unwrap();

    // `apply` with the sim driver: a new data dir, the log, the sim's state.
    let data = tmp.path().join("var").join("data");
    agent(
        &config,
        &data,
        &["apply", "--driver", "sim", input.to_str().unwrap()],
    );
    assert_mode(&data, 0o700, mask);
    assert_mode(data.parent().unwrap(), 0o700, mask);
    let log = data.join("log");
    assert_mode(&log, 0o700, mask);
    let mut sim_files = 0;
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            assert_mode(&path, 0o600, mask);
            sim_files += 1;
        }
    }
    assert!(
        sim_files > 0,
        "the sim driver keeps its state in the data dir"
    );

    // A log directory an earlier build left open is closed when the log is opened;
    // `log export -o` writes the records 0600.
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tmp.path().join("export.jsonl");
    agent(
        &config,
        &data,
        &["log", "export", "-o", out.to_str().unwrap()],
    );
    assert_mode(&log, 0o700, mask);
    assert_mode(&out, 0o600, mask);

    // Retention's export files, in directories it makes.
    let file = export::file_name(&tmp.path().join("export").join("h1"), 1, 2);
    export::write_durably(&file, &[serde_json::json!({"seq": 1})]).unwrap();
    assert_mode(&file, 0o600, mask);
    assert_mode(file.parent().unwrap(), 0o700, mask);
    assert_mode(&tmp.path().join("export"), 0o700, mask);

    // The host key.
    let key = tmp.path().join("keys").join("h1").join("host.key");
    capstan_agent::host_key::load_or_create(&key).unwrap();
    assert_mode(&key, 0o600, mask);
    assert_mode(key.parent().unwrap(), 0o700, mask);
    assert_mode(&tmp.path().join("keys"), 0o700, mask);

    // The systemd driver's files: units for systemd and everyone, env drop-ins
    // (which may hold credentials) for root.
    #[cfg(feature = "systemd")]
    {
        use capstan_systemd::files;
        let units = tmp.path().join("units");
        std::fs::create_dir(&units).unwrap();
        let unit = units.join("capstan-h1-shop-web-r1.service");
        assert!(files::write_if_changed(&unit, "[Service]\n", files::UNIT).unwrap());
        assert_mode(&unit, 0o644, mask);
        let dropin = units
            .join("capstan-h1-shop-web-r1.service.d")
            .join("50-capstan-env.conf");
        let env = "[Service]\nEnvironment=\"TOKEN=s3cret\"\n";
        assert!(files::write_if_changed(&dropin, env, files::ENV_DROPIN).unwrap());
        assert_mode(&dropin, 0o600, mask);
        assert_mode(dropin.parent().unwrap(), 0o755, mask);
        // One an earlier build left with the umask's mode is set right, unchanged.
        std::fs::set_permissions(&dropin, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(!files::write_if_changed(&dropin, env, files::ENV_DROPIN).unwrap());
        assert_mode(&dropin, 0o600, mask);
    }
}

#[test]
fn files_the_agent_writes_have_the_modes_of_its_code_under_any_umask() {
    // The most open umask, and one that would close what others must read.
    for mask in [0o000, 0o077] {
        let previous = umask(Mode::from_bits_truncate(mask));
        check(mask);
        umask(previous);
    }
}
