//! `capstan-envdump OUT_PATH [ARGS...]`: the workload the systemd tests (and
//! `capstan-bench`'s systemd measurement) run. [`main`] is all of it: the
//! `capstan-envdump` binary of this crate calls it, and `capstan-bench` calls it when
//! it is run under that name (see [`crate::systemd::SystemdHost::boot_with`]).
//!
//! Writes to `OUT_PATH`, atomically (a temp file in the same directory, then a
//! rename), one JSON object: `{"argv": [...], "env": {...}, "pid": N}` — every argv
//! entry (argv[0] included) and every environment variable, byte for byte: valid
//! UTF-8 as a JSON string, anything else as `{"hex": "<bytes in hex>"}` (an env
//! *name* that is not UTF-8 becomes the key `hex:<bytes in hex>`), so a mismatch
//! shows instead of being smoothed over by a lossy conversion.
//!
//! Then, by default, it stays up until SIGTERM and exits 0 (so its unit is `active`
//! and a stop is clean). With `ENVDUMP_EXIT=<code>` it exits with that code as soon
//! as the file is written (crash loops, failed starts).
//!
//! Exit 2 on a usage error or a write that failed (with the reason on stderr).

use serde_json::{Map, Value};
use std::ffi::OsStr;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A value exactly as given: a string if it is UTF-8, else its bytes in hex.
fn exact(s: &OsStr) -> Value {
    match std::str::from_utf8(s.as_bytes()) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => serde_json::json!({ "hex": hex(s.as_bytes()) }),
    }
}

fn dump() -> Value {
    let argv: Vec<Value> = std::env::args_os().map(|a| exact(&a)).collect();
    let env: Map<String, Value> = std::env::vars_os()
        .map(|(k, v)| {
            let key = match std::str::from_utf8(k.as_bytes()) {
                Ok(text) => text.to_string(),
                Err(_) => format!("hex:{}", hex(k.as_bytes())),
            };
            (key, exact(&v))
        })
        .collect();
    serde_json::json!({ "argv": argv, "env": env, "pid": std::process::id() })
}

/// Writes `body` to `out` through a temp file in the same directory and a rename, so
/// a reader sees no file or the whole file.
fn write_atomically(out: &Path, body: &[u8]) -> std::io::Result<()> {
    let name = out
        .file_name()
        .ok_or_else(|| std::io::Error::other("OUT_PATH names no file"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp: PathBuf = out.with_file_name(tmp_name);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(body)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, out)
}

fn fail(message: &str) -> ! {
    eprintln!("capstan-envdump: {message}");
    std::process::exit(2);
}

/// Runs `capstan-envdump` with this process's arguments and environment; never
/// returns.
pub fn main() -> ! {
    let Some(out) = std::env::args_os().nth(1) else {
        fail("usage: capstan-envdump OUT_PATH [ARGS...]  (ENVDUMP_EXIT=<code> to exit at once)");
    };
    let exit_code = std::env::var_os("ENVDUMP_EXIT").map(|code| {
        code.to_str()
            .and_then(|c| c.parse::<i32>().ok())
            .unwrap_or_else(|| fail(&format!("ENVDUMP_EXIT={code:?} is not an exit code")))
    });
    // The SIGTERM handler is in place before the file appears: whoever waits for
    // the file may stop us at once, and that stop must still be a clean exit 0.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut term = runtime.block_on(async {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler")
    });
    let mut body = serde_json::to_vec(&dump()).expect("JSON of strings");
    body.push(b'\n');
    if let Err(e) = write_atomically(Path::new(&out), &body) {
        fail(&format!("cannot write {}: {e}", Path::new(&out).display()));
    }
    if let Some(code) = exit_code {
        std::process::exit(code);
    }
    runtime.block_on(term.recv());
    std::process::exit(0);
}
