//! Quoting for unit files, as systemd 252 (Debian bookworm) parses them: the
//! security boundary between a spec and the files the driver writes. Every value
//! either reaches the process byte for byte or is rejected; none can end a line,
//! continue one, open a section or add a directive.
//!
//! What 252 does with a unit-file line (read in its `load-fragment.c`,
//! `conf-parser.c`, `extract-word.c`, `escape.c`, `specifier.c`, `env-util.c`):
//! - a file is read line by line, and `\n`, `\r` and NUL all end a line; a line whose
//!   last `\` is unpaired continues on the next line; the value is stripped of
//!   surrounding white space;
//! - `Environment=` and `ExecStart=` split the value into words, each unquoted
//!   (`"…"`, `'…'`) and C-unescaped (`\n`, `\xNN`, …; `\x00` is refused); only then
//!   are each word's `%` specifiers expanded (`%%` is `%`);
//! - `ExecStart=` also: an unquoted `;` word separates commands (a quoted `";"` is
//!   a literal argument); at exec time every argument has `$$` turned into `$` and
//!   `${X}` expanded, and a whole-word `$X` is expanded *and split*; the executable's
//!   path is never env-expanded, and one holding quotes, `\` or control characters is
//!   refused;
//! - `ReadWritePaths=` unquotes words but does not C-unescape them (inside quotes a
//!   `\` takes the next character literally), then expands specifiers;
//! - `WorkingDirectory=` neither splits nor unquotes: specifiers only, then the path
//!   is simplified (`//`, `/./` collapse) and must be normalized (no `..`).
//!
//! The tests decode what is written with a model of those rules
//! (`escape/decode.rs`). A unit rendered with the tests' hostile corpus was also run
//! under systemd 252.38 (Debian bookworm): argv, environment, working directory and
//! writable paths reached the process byte for byte.

use capstan_common::ErrorCode;
use std::fmt::Write as _;

#[cfg(test)]
pub(crate) mod decode;
#[cfg(test)]
mod tests;

/// The longest line written. systemd reads lines of up to 1 MiB; stay well under.
pub const MAX_LINE: usize = 256 * 1024;
/// systemd's `PATH_MAX - 1`: the longest path a unit file may name.
const MAX_PATH: usize = 4095;
/// systemd's `NAME_MAX`: the longest component of such a path.
const MAX_PATH_COMPONENT: usize = 255;
/// How much of a refused name an error shows.
const SNIPPET_CHARS: usize = 16;
/// Room left on a line for a directive's name, by the functions that return only
/// the value.
const DIRECTIVE_ROOM: usize = 64;

/// A value that cannot be written into a unit file. Messages name the field and
/// why; they never carry a value, at most a short escaped prefix of a bad name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EscapeError {
    #[error("environment variable name {name} is not ^[A-Za-z_][A-Za-z0-9_]*$")]
    EnvName { name: String },
    #[error("environment variable {name}: {why}")]
    EnvValue { name: String, why: &'static str },
    /// An item of the command line (argv), by index.
    #[error("command[{index}]: {why}")]
    Command { index: usize, why: &'static str },
    #[error("{field}: {why}")]
    Invalid {
        field: &'static str,
        why: &'static str,
    },
    /// An item of a list, by index.
    #[error("{field}[{index}]: {why}")]
    InvalidItem {
        field: &'static str,
        index: usize,
        why: &'static str,
    },
    /// The spec's `systemd` section does not parse (the reason, from the parser).
    #[error("`systemd`: {0}")]
    Settings(String),
}

impl EscapeError {
    /// The stable code reported for this refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            EscapeError::EnvName { .. } | EscapeError::EnvValue { .. } => ErrorCode::InvalidEnv,
            _ => ErrorCode::InvalidSpec,
        }
    }

    /// The same refusal, naming `field` (the setting) instead of the generic "path"
    /// or "paths" of [`path`] and [`path_list`].
    pub fn within(self, field: &'static str) -> Self {
        match self {
            EscapeError::Invalid { why, .. } => EscapeError::Invalid { field, why },
            EscapeError::InvalidItem { index, why, .. } => {
                EscapeError::InvalidItem { field, index, why }
            }
            other => other,
        }
    }
}

/// One complete `Environment="NAME=value"` line, without its newline.
pub fn environment(name: &str, value: &str) -> Result<String, EscapeError> {
    if !is_env_name(name) {
        return Err(EscapeError::EnvName {
            name: snippet(name),
        });
    }
    let refuse = |why| EscapeError::EnvValue {
        name: snippet(name),
        why,
    };
    if value.contains('\0') {
        return Err(refuse("value holds NUL"));
    }
    let mut line = format!("Environment=\"{name}=");
    c_quoted_body(&mut line, value, false);
    line.push('"');
    if line.len() > MAX_LINE {
        return Err(refuse("value too long for one unit-file line"));
    }
    Ok(line)
}

/// The value of `ExecStart=` running exactly `argv`: every word double-quoted and
/// C-escaped, `%` doubled (specifiers) and, since systemd env-expands arguments at
/// exec time, `$` doubled. `argv[0]` must be an absolute path that systemd takes as
/// it is: no quotes, `\`, control characters or `$` (systemd never env-expands the
/// path it executes, but does expand `argv[0]`, so a `$` would make them differ).
/// systemd reads the prefixes (`-`, `@`, `:`, `+`, `!`) from the unquoted first word,
/// so quoting cannot hide one: the leading `/` is what keeps them out.
pub fn exec_start(argv: &[String]) -> Result<String, EscapeError> {
    let refuse = |index, why| EscapeError::Command { index, why };
    let Some(program) = argv.first() else {
        return Err(refuse(0, "missing: the program must be an absolute path"));
    };
    if !program.starts_with('/') {
        return Err(refuse(0, "the program must be an absolute path"));
    }
    if program.ends_with('/') {
        return Err(refuse(0, "the program must not end with '/'"));
    }
    if program.contains(|c: char| c.is_ascii_control() || matches!(c, '"' | '\'' | '\\' | '$')) {
        return Err(refuse(
            0,
            "the program must not hold quotes, '\\', '$' or control characters",
        ));
    }
    if let Err(why) = path_lengths(program) {
        return Err(refuse(0, why));
    }
    let mut value = String::new();
    for (index, word) in argv.iter().enumerate() {
        if word.contains('\0') {
            return Err(refuse(index, "holds NUL"));
        }
        if index > 0 {
            value.push(' ');
        }
        value.push('"');
        c_quoted_body(&mut value, word, true);
        value.push('"');
    }
    fits_a_line("command", value)
}

/// The value of a single-path setting that systemd neither splits nor unquotes
/// (`WorkingDirectory=`): the path with `%` doubled. What that cannot carry is
/// refused: control characters, `\` (an unpaired one would continue the line), a
/// trailing space (stripped), `..` (systemd refuses it) and over-long paths.
pub fn path(p: &str) -> Result<String, EscapeError> {
    let refuse = |why| EscapeError::Invalid { field: "path", why };
    check_path(p).map_err(refuse)?;
    if p.contains('\\') {
        return Err(refuse("must not hold '\\'"));
    }
    if p.ends_with(' ') {
        return Err(refuse("must not end with a space"));
    }
    Ok(p.replace('%', "%%"))
}

/// The value of a path-list setting (`ReadWritePaths=`): each path double-quoted,
/// with `\`, `"` escaped and `%` doubled, separated by spaces. systemd 252 unquotes
/// these words without C-unescaping, so control characters cannot be written and are
/// refused. An empty list is refused too (an empty assignment resets the setting).
pub fn path_list(paths: &[String]) -> Result<String, EscapeError> {
    if paths.is_empty() {
        return Err(EscapeError::Invalid {
            field: "paths",
            why: "empty (an empty assignment resets the setting)",
        });
    }
    let mut value = String::new();
    for (index, p) in paths.iter().enumerate() {
        check_path(p).map_err(|why| EscapeError::InvalidItem {
            field: "paths",
            index,
            why,
        })?;
        if index > 0 {
            value.push(' ');
        }
        value.push('"');
        for c in p.chars() {
            match c {
                '\\' | '"' => {
                    value.push('\\');
                    value.push(c);
                }
                '%' => value.push_str("%%"),
                c => value.push(c),
            }
        }
        value.push('"');
    }
    fits_a_line("paths", value)
}

/// A simple token written as it is (`User=`, `Group=`, markers, pieces of
/// `Description=`): non-empty, only `[A-Za-z0-9._:@/+-]`, so nothing in it is quoted,
/// escaped or expanded.
pub fn plain(field: &'static str, s: &str) -> Result<String, EscapeError> {
    let ok =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '/' | '+' | '-');
    if s.is_empty() {
        return Err(EscapeError::Invalid {
            field,
            why: "empty",
        });
    }
    if s.len() > 1024 || !s.chars().all(ok) {
        return Err(EscapeError::Invalid {
            field,
            why: "must be at most 1024 of [A-Za-z0-9._:@/+-]",
        });
    }
    Ok(s.to_string())
}

/// The value of `StateDirectory=`: a path relative to `/var/lib`, written as it is.
/// systemd 252 splits that setting on white space and `:` (a second field names
/// symlinks), unquotes it and expands specifiers, so only `[A-Za-z0-9._-]`
/// components are taken, none of them empty, `.` or `..`.
pub fn state_directory(rel: &str) -> Result<String, EscapeError> {
    let refuse = |why| EscapeError::Invalid {
        field: "state_dir",
        why,
    };
    let part_ok = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    if rel.starts_with('/') || !rel.split('/').all(part_ok) {
        return Err(refuse(
            "must be a path under /var/lib of [A-Za-z0-9._-] components",
        ));
    }
    check_path(&format!("/var/lib/{rel}")).map_err(refuse)?;
    Ok(rel.to_string())
}

/// The value of `CapabilityBoundingSet=` and `AmbientCapabilities=`: the names, each
/// one of [`crate::spec::SYSTEMD_CAPABILITIES`], separated by spaces;
/// empty for none (an empty assignment empties the set).
pub fn capabilities(names: &[String]) -> Result<String, EscapeError> {
    let allowed = crate::spec::SYSTEMD_CAPABILITIES;
    if let Some(index) = names.iter().position(|n| !allowed.contains(&n.as_str())) {
        return Err(EscapeError::InvalidItem {
            field: "systemd.capabilities",
            index,
            why: "not a capability a spec may ask for",
        });
    }
    Ok(names.join(" "))
}

/// The value of a `SystemCallFilter=` line allowing `items` (systemd groups or
/// syscall names, [`crate::spec::is_syscall_item`]), separated by spaces.
pub fn syscalls(items: &[String]) -> Result<String, EscapeError> {
    if let Some(index) = items.iter().position(|c| !crate::spec::is_syscall_item(c)) {
        return Err(EscapeError::InvalidItem {
            field: "systemd.syscalls",
            index,
            why: "neither a systemd syscall group nor a syscall name",
        });
    }
    fits_a_line("systemd.syscalls", items.join(" "))
}

/// `value`, when one line holds it after a directive's name.
fn fits_a_line(field: &'static str, value: String) -> Result<String, EscapeError> {
    if value.len() > MAX_LINE - DIRECTIVE_ROOM {
        return Err(EscapeError::Invalid {
            field,
            why: "too long for one unit-file line",
        });
    }
    Ok(value)
}

/// Appends `s` as the inside of a double-quoted, C-unescaped word: `\`, `"` and
/// control characters escaped, `%` doubled, and `$` doubled when `dollars`.
/// Non-ASCII passes as it is. The caller has refused NUL.
fn c_quoted_body(out: &mut String, s: &str, dollars: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '%' => out.push_str("%%"),
            '$' if dollars => out.push_str("$$"),
            c if c.is_ascii_control() => {
                debug_assert!(c != '\0', "NUL is refused before quoting");
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// The checks every written path shares: absolute, no control characters, no `..`
/// component, within systemd's length limits.
fn check_path(p: &str) -> Result<(), &'static str> {
    if !p.starts_with('/') {
        return Err("must be an absolute path");
    }
    if p.contains(|c: char| c.is_ascii_control()) {
        return Err("must not hold control characters");
    }
    if p.split('/').any(|c| c == "..") {
        return Err("must not hold '..'");
    }
    path_lengths(p)
}

fn path_lengths(p: &str) -> Result<(), &'static str> {
    if p.len() > MAX_PATH || p.split('/').any(|c| c.len() > MAX_PATH_COMPONENT) {
        return Err("longer than systemd takes (4095 bytes, 255 a component)");
    }
    Ok(())
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`, as systemd's `env_name_is_valid` (less its ARG_MAX
/// bound, which the line limit undercuts).
fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// At most [`SNIPPET_CHARS`] characters of `s`, escaped, for an error message.
fn snippet(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(SNIPPET_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if s.chars().nth(SNIPPET_CHARS).is_some() {
        out.push('…');
    }
    out
}
