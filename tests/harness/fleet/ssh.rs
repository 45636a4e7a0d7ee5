//! SSH into fleet hosts: the test's client key, each host's own host key, and the
//! readiness probe (a TCP connect and sshd's banner).

use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// How long one probe or one `ssh` may wait for a connection: a partitioned host
/// drops packets, so a probe of it ends by this timeout.
pub const CONNECT: Duration = Duration::from_secs(2);

/// Makes an ed25519 keypair at `path` and `path.pub` (no passphrase).
pub fn keygen(path: &Path, comment: &str) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .expect("run ssh-keygen (Debian's openssh-client)");
    assert!(
        out.status.success(),
        "ssh-keygen -f {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `path.pub`, the public half of [`keygen`]'s key at `path`.
pub fn public(path: &Path) -> String {
    let mut p = path.as_os_str().to_owned();
    p.push(".pub");
    let p = PathBuf::from(p);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Whether sshd answers on `addr:22`: a TCP connection within [`CONNECT`] whose
/// first bytes are an SSH-2 banner.
pub fn answers(addr: Ipv4Addr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&SocketAddr::from((addr, 22)), CONNECT) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(CONNECT));
    let mut banner = [0u8; 8];
    stream.read_exact(&mut banner).is_ok() && &banner == b"SSH-2.0-"
}

/// `ssh` as root to `addr` with `key`, trusting only the host key in `known_hosts`
/// (`StrictHostKeyChecking=yes`), and nothing from the machine's ssh config.
/// Fails the test if it has not ended within [`crate::READY`].
#[track_caller]
pub fn ssh(addr: Ipv4Addr, key: &Path, known_hosts: &Path, command: &[&str]) -> Output {
    let mut c = Command::new("ssh");
    c.args(["-F", "/dev/null", "-i"])
        .arg(key)
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args([
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .args(["-o", "BatchMode=yes", "-o", "LogLevel=ERROR"])
        .arg("-o")
        .arg(format!("ConnectTimeout={}", CONNECT.as_secs()))
        .arg(format!("root@{addr}"))
        .arg("--")
        .args(command);
    crate::process::output(format_args!("ssh root@{addr} {command:?}"), crate::READY, c)
}
