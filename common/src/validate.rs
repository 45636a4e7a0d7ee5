//! Grammar checks for every value that ends up in a name, a label, a unit file, a
//! container or a manifest. Hand-written (no regex engine): each is a few lines and
//! the grammar is in its doc comment.

use crate::{DriverKind, ErrorCode, Rejection, Spec};

/// `id`: 1–128 characters of `[A-Za-z0-9._:-]`.
pub fn command_id(id: &str) -> Result<(), Rejection> {
    let ok = (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Rejection::new(
            ErrorCode::InvalidId,
            "`id` must be 1-128 characters of [A-Za-z0-9._:-]",
        ))
    }
}

/// Host, namespace, workload and revision names: a DNS label,
/// `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && inner(&b[0])
        && inner(&b[b.len() - 1])
        && b.iter().all(|c| inner(c) || *c == b'-')
}

/// [`is_dns_label`], as a rejection naming the field.
pub fn name(field: &str, value: &str) -> Result<(), Rejection> {
    if is_dns_label(value) {
        Ok(())
    } else {
        Err(Rejection::new(
            ErrorCode::InvalidName,
            format!("`{field}` must be a DNS label: 1-63 of [a-z0-9-], starting and ending alphanumeric"),
        ))
    }
}

/// Spec env names: `^[A-Za-z_][A-Za-z0-9_]*$` (at most 256 bytes).
pub fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// [`is_image_ref`]'s grammar as a regular expression (ECMA 262 and the `regex`
/// crate alike; what the OpenAPI description's `Spec.image` says), for a string of at
/// most [`IMAGE_REF_MAX_LEN`] bytes: a first path component with more after it is a
/// registry host when it holds `.` or `:` (or is `localhost`, which is a component
/// too); a tag follows the last component, a digest the tag. A test holds the two
/// to the same verdicts.
pub const IMAGE_REF_PATTERN: &str = concat!(
    "^(?:",
    // A registry host, or a component without `.` (one with is a host), then more.
    "(?:[A-Za-z0-9.:-]*[.:][A-Za-z0-9.:-]*|[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?)",
    "(?:/[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)+",
    // Or one component alone.
    "|[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?",
    ")",
    "(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?",
    "(?:@sha256:[0-9a-f]{64})?$",
);

/// The longest image reference [`is_image_ref`] takes.
pub const IMAGE_REF_MAX_LEN: usize = 512;

/// A container image reference: `[host[:port]/]path[:tag][@sha256:<64 hex>]`, where
/// path components are `[a-z0-9]+([._-][a-z0-9]+)*`. Also [`IMAGE_REF_PATTERN`].
pub fn is_image_ref(s: &str) -> bool {
    if s.is_empty() || s.len() > IMAGE_REF_MAX_LEN {
        return false;
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        {
            return false;
        }
    }
    // A tag is after the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let tb = t.as_bytes();
        let ok = !tb.is_empty()
            && tb.len() <= 128
            && (tb[0].is_ascii_alphanumeric() || tb[0] == b'_')
            && tb
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
        if !ok {
            return false;
        }
    }
    let mut parts: Vec<&str> = path.split('/').collect();
    if parts.len() > 1
        && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
    {
        let host = parts.remove(0);
        let ok = host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b':'));
        if !ok {
            return false;
        }
    }
    parts.iter().all(|p| is_path_component(p))
}

fn is_path_component(p: &str) -> bool {
    let b = p.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

/// Checks a revision spec: env grammar, argv without NUL, the image reference where the
/// driver needs one.
pub fn spec(spec: &Spec) -> Result<(), Rejection> {
    for (name, value) in &spec.env {
        if !is_env_name(name) {
            return Err(Rejection::new(
                ErrorCode::InvalidEnv,
                format!(
                    "env name {:?} must match ^[A-Za-z_][A-Za-z0-9_]*$",
                    truncate(name)
                ),
            ));
        }
        if value.contains('\0') {
            return Err(Rejection::new(
                ErrorCode::InvalidEnv,
                format!("env value of {name} contains NUL"),
            ));
        }
    }
    if spec.command.iter().any(|a| a.contains('\0')) {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            "`command` argument contains NUL",
        ));
    }
    if let Some(dir) = &spec.working_dir {
        if !is_abs_path(dir) {
            return Err(Rejection::new(
                ErrorCode::InvalidSpec,
                "`working_dir` must be an absolute path without NUL, newline or `..`",
            ));
        }
    }
    for m in &spec.mounts {
        if !(is_abs_path(&m.source) || is_volume_name(&m.source)) || !is_abs_path(&m.target) {
            return Err(Rejection::new(
                ErrorCode::InvalidSpec,
                "a mount needs `source` (an absolute path or a volume name [A-Za-z0-9][A-Za-z0-9_.-]*) and an absolute `target`, without NUL, newline, `,` or `..`",
            ));
        }
    }
    for p in &spec.ports {
        let ip_ok = p
            .host_ip
            .as_deref()
            .is_none_or(|ip| ip.parse::<std::net::IpAddr>().is_ok());
        if p.container_port == 0 || !ip_ok {
            return Err(Rejection::new(
                ErrorCode::InvalidSpec,
                "a port needs `container_port` 1-65535 and, if given, `host_ip` an IP address",
            ));
        }
    }
    systemd(spec)?;
    if let Some(readiness) = &spec.readiness {
        crate::readiness::validate(readiness, spec.driver)?;
    }
    match (&spec.image, spec.driver) {
        (Some(image), _) if !is_image_ref(image) => Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "`image` {:?} is not a valid image reference",
                truncate(image)
            ),
        )),
        (None, DriverKind::Docker | DriverKind::Kube) => Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!("driver {} needs `image`", spec.driver.as_str()),
        )),
        _ => Ok(()),
    }
}

/// The systemd driver's own rules: an absolute program to run, and settings it can
/// write into a unit. Other drivers refuse a spec that carries systemd settings.
fn systemd(spec: &Spec) -> Result<(), Rejection> {
    let invalid = |m: &str| Err(Rejection::new(ErrorCode::InvalidSpec, m));
    let s = &spec.systemd;
    if spec.driver != DriverKind::Systemd {
        if !s.is_default() {
            return invalid("`systemd` settings are only for driver systemd");
        }
        return Ok(());
    }
    match spec.command.first() {
        Some(program) if is_abs_path(program) => {}
        _ => return invalid("driver systemd needs `command` whose first item is an absolute path"),
    }
    if spec.image.is_some() {
        return invalid("driver systemd runs no image: leave `image` out");
    }
    if !spec.mounts.is_empty() || !spec.ports.is_empty() {
        return invalid(
            "driver systemd has no `mounts` or `ports`: use `systemd.read_write_paths`",
        );
    }
    for id in [&s.user, &s.group].into_iter().flatten() {
        if !is_account_name(id) {
            return invalid(
                "`systemd.user`/`group` must be a number (0-4294967294, not 65535) or match ^[a-z_][a-z0-9_-]{0,31}$",
            );
        }
    }
    if let Some(bad) = s
        .capabilities
        .iter()
        .find(|c| !SYSTEMD_CAPABILITIES.contains(&c.as_str()))
    {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "`systemd.capabilities`: {:?} is not one a spec may ask for ({})",
                truncate(bad),
                SYSTEMD_CAPABILITIES.join(", ")
            ),
        ));
    }
    if s.capabilities
        .iter()
        .enumerate()
        .any(|(i, c)| s.capabilities[..i].contains(c))
    {
        return invalid("`systemd.capabilities` names a capability twice");
    }
    if s.syscalls.len() > MAX_SYSCALLS {
        return invalid("`systemd.syscalls` holds at most 128 items");
    }
    if let Some(bad) = s.syscalls.iter().find(|c| !is_syscall_item(c)) {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "`systemd.syscalls`: {:?} is neither one of systemd's groups ({}) nor a syscall name ^[a-z_][a-z0-9_]{{0,63}}$",
                truncate(bad),
                SYSCALL_GROUPS.join(", ")
            ),
        ));
    }
    if !s.read_write_paths.iter().all(|p| is_abs_path(p)) {
        return invalid(
            "`systemd.read_write_paths` must be absolute paths without NUL, newline, `,` or `..`",
        );
    }
    if s.memory_max_bytes == Some(0) || s.cpu_quota_percent == Some(0) {
        return invalid("`systemd.memory_max_bytes` and `cpu_quota_percent` must be above 0");
    }
    Ok(())
}

/// The capabilities a systemd spec may ask for (`systemd.capabilities`). Left out on
/// purpose, as each one reaches beyond the workload's own files and processes on a
/// shared host: `CAP_SYS_ADMIN`, `CAP_SYS_MODULE`, `CAP_SYS_RAWIO`, `CAP_SYS_PTRACE`,
/// `CAP_SYS_BOOT`, `CAP_SYS_TIME`, `CAP_SYS_NICE`, `CAP_SYS_RESOURCE`,
/// `CAP_SYS_PACCT`, `CAP_SYS_TTY_CONFIG`, `CAP_SYS_CHROOT`, `CAP_NET_ADMIN`,
/// `CAP_KILL`, `CAP_SETUID`, `CAP_SETGID`, `CAP_SETPCAP`, `CAP_SETFCAP`,
/// `CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_MKNOD`, `CAP_LINUX_IMMUTABLE`,
/// `CAP_IPC_OWNER`, `CAP_MAC_ADMIN`, `CAP_MAC_OVERRIDE`, `CAP_AUDIT_CONTROL`,
/// `CAP_AUDIT_READ`, `CAP_SYSLOG`, `CAP_BPF`, `CAP_PERFMON`, `CAP_CHECKPOINT_RESTORE`
/// (`docs/systemd.md`, *Hardening*).
pub const SYSTEMD_CAPABILITIES: &[&str] = &[
    "CAP_AUDIT_WRITE",
    "CAP_BLOCK_SUSPEND",
    "CAP_CHOWN",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_IPC_LOCK",
    "CAP_LEASE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_RAW",
    "CAP_WAKE_ALARM",
];

/// systemd 252's system call groups (`systemd-analyze syscall-filter`), which
/// `systemd.syscalls` may name.
pub const SYSCALL_GROUPS: &[&str] = &[
    "@aio",
    "@basic-io",
    "@chown",
    "@clock",
    "@cpu-emulation",
    "@debug",
    "@file-system",
    "@io-event",
    "@ipc",
    "@keyring",
    "@known",
    "@memlock",
    "@module",
    "@mount",
    "@network-io",
    "@obsolete",
    "@pkey",
    "@privileged",
    "@process",
    "@raw-io",
    "@reboot",
    "@resources",
    "@sandbox",
    "@setuid",
    "@signal",
    "@swap",
    "@sync",
    "@system-service",
    "@timer",
];

/// The most items `systemd.syscalls` holds.
const MAX_SYSCALLS: usize = 128;

/// One of [`SYSCALL_GROUPS`], or a system call's name: `^[a-z_][a-z0-9_]{0,63}$`.
pub fn is_syscall_item(s: &str) -> bool {
    if s.starts_with('@') {
        return SYSCALL_GROUPS.contains(&s);
    }
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// A user or group as systemd's `User=`/`Group=` take it: a numeric id (not
/// 4294967295 nor 65535, the 32- and 16-bit "no id") or a portable account name.
pub fn is_account_name(s: &str) -> bool {
    let b = s.as_bytes();
    if !b.is_empty() && b.iter().all(u8::is_ascii_digit) {
        return s
            .parse::<u32>()
            .is_ok_and(|id| id != u32::MAX && id != 65535);
    }
    !b.is_empty()
        && b.len() <= 32
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-'))
}

/// An absolute path of at most 4096 bytes, without NUL, newline, `,` (the mount
/// option separator) or `..` components.
pub fn is_abs_path(s: &str) -> bool {
    s.starts_with('/')
        && s.len() <= 4096
        && !s.contains(['\0', '\n', '\r', ','])
        && !s.split('/').any(|c| c == "..")
}

/// A named volume: `^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`.
pub fn is_volume_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn systemd_spec(command: &[&str]) -> Spec {
        Spec {
            driver: DriverKind::Systemd,
            image: None,
            command: command.iter().map(|s| s.to_string()).collect(),
            env: Default::default(),
            working_dir: None,
            mounts: vec![],
            ports: vec![],
            systemd: Default::default(),
            kube: Default::default(),
            readiness: None,
            strategy: Default::default(),
        }
    }

    fn invalid(spec: &Spec) -> String {
        let e = super::spec(spec).expect_err("should be refused");
        assert_eq!(e.code, ErrorCode::InvalidSpec, "{e:?}");
        e.message
    }

    #[test]
    fn a_systemd_spec_runs_an_absolute_program_with_settings_a_unit_can_hold() {
        let mut ok = systemd_spec(&["/usr/bin/app", "--flag", "a b; $X %h"]);
        ok.systemd.user = Some("app".into());
        ok.systemd.group = Some("1001".into());
        ok.systemd.read_write_paths = vec!["/srv/app data".into()];
        ok.systemd.memory_max_bytes = Some(64 << 20);
        ok.systemd.cpu_quota_percent = Some(150);
        super::spec(&ok).unwrap();

        assert!(invalid(&systemd_spec(&[])).contains("absolute"));
        assert!(invalid(&systemd_spec(&["app"])).contains("absolute"));
        assert!(invalid(&systemd_spec(&["-/bin/app"])).contains("absolute"));
        let mut image = systemd_spec(&["/bin/app"]);
        image.image = Some("busybox".into());
        assert!(invalid(&image).contains("image"));
        for user in ["Root", "a b", "x\ny", "", "-x", &"a".repeat(33)] {
            let mut s = systemd_spec(&["/bin/app"]);
            s.systemd.user = Some(user.into());
            assert!(invalid(&s).contains("user"), "{user:?}");
        }
        let mut path = systemd_spec(&["/bin/app"]);
        path.systemd.read_write_paths = vec!["relative".into()];
        assert!(invalid(&path).contains("read_write_paths"));
        let mut zero = systemd_spec(&["/bin/app"]);
        zero.systemd.memory_max_bytes = Some(0);
        assert!(invalid(&zero).contains("above 0"));
    }

    /// Given a systemd spec asking for more than the hardened default, when it is
    /// validated, then only names from the allow-lists and grammars pass.
    #[test]
    fn a_systemd_spec_may_ask_for_listed_capabilities_and_syscalls_only() {
        let mut ok = systemd_spec(&["/bin/app"]);
        ok.systemd.user = Some("0".into());
        ok.systemd.capabilities = vec!["CAP_NET_BIND_SERVICE".into(), "CAP_IPC_LOCK".into()];
        ok.systemd.syscalls = vec!["@privileged".into(), "ptrace".into(), "_llseek".into()];
        super::spec(&ok).unwrap();

        for cap in [
            "CAP_SYS_ADMIN",
            "cap_net_bind_service",
            "NET_BIND_SERVICE",
            "CAP_NET_BIND_SERVICE\nUser=root",
            "CAP_NET_BIND_SERVICE CAP_SYS_ADMIN",
            "",
            "CAP_NËT",
        ] {
            let mut s = systemd_spec(&["/bin/app"]);
            s.systemd.capabilities = vec!["CAP_CHOWN".into(), cap.into()];
            assert!(invalid(&s).contains("systemd.capabilities"), "{cap:?}");
        }
        for call in [
            "@nosuchgroup",
            "~@privileged",
            "Ptrace",
            "ptrace\n[Service]",
            "a b",
            "",
            "é",
            &"a".repeat(65),
        ] {
            let mut s = systemd_spec(&["/bin/app"]);
            s.systemd.syscalls = vec![call.into()];
            assert!(invalid(&s).contains("systemd.syscalls"), "{call:?}");
        }
        let mut many = systemd_spec(&["/bin/app"]);
        many.systemd.syscalls = vec!["read".into(); 129];
        assert!(invalid(&many).contains("at most 128"));
        let mut twice = systemd_spec(&["/bin/app"]);
        twice.systemd.capabilities =
            vec!["CAP_CHOWN".into(), "CAP_LEASE".into(), "CAP_CHOWN".into()];
        assert!(invalid(&twice).contains("twice"));
    }

    /// Given user and group names, when validated, then a unix account name or a
    /// usable numeric id passes, and nothing that could end a unit-file line does.
    #[test]
    fn systemd_user_and_group_names_are_account_names() {
        for ok in [
            "app",
            "_svc",
            "web-1",
            "a_b-c",
            "0",
            "1001",
            "4294967294",
            &"a".repeat(32),
        ] {
            assert!(is_account_name(ok), "{ok:?}");
        }
        for bad in [
            "",
            "Root",
            "1a",
            "-x",
            "a b",
            "app\nUser=root",
            "app\r",
            "app;id",
            "ápp",
            "4294967295",
            "65535",
            "99999999999",
            &"a".repeat(33),
        ] {
            assert!(!is_account_name(bad), "{bad:?}");
            let mut s = systemd_spec(&["/bin/app"]);
            s.systemd.group = Some(bad.into());
            assert!(invalid(&s).contains("user`/`group"), "{bad:?}");
        }
    }

    #[test]
    fn other_drivers_refuse_systemd_settings() {
        let mut s = systemd_spec(&["/bin/app"]);
        s.driver = DriverKind::Sim;
        super::spec(&s).unwrap();
        s.systemd.user = Some("app".into());
        assert!(invalid(&s).contains("only for driver systemd"));
    }

    #[test]
    fn stop_first_is_written_out_and_every_driver_takes_it() {
        let mut s = systemd_spec(&["/bin/app"]);
        s.strategy = crate::Strategy::StopFirst;
        super::spec(&s).unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains(r#""strategy":"stop-first""#), "{json}");
        let default = serde_json::to_string(&systemd_spec(&["/bin/app"])).unwrap();
        assert!(
            !default.contains("strategy"),
            "left out at its default: {default}"
        );
        // The kube driver replaces a revision stop-first with a Recreate Deployment.
        s.driver = DriverKind::Kube;
        s.command = vec![];
        s.image = Some("shop/web:1".into());
        super::spec(&s).unwrap();
    }

    #[test]
    fn dns_labels() {
        for ok in ["a", "a1", "web-1", "0", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64), "é"] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn image_refs() {
        for ok in [
            "busybox",
            "busybox:1.36",
            "library/busybox:latest",
            "registry.local:5000/team/app:v1.2_3",
            "localhost/app",
            "capstan-test/busybox:1",
            "app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert!(is_image_ref(ok), "{ok}");
        }
        for bad in [
            "",
            "Busybox",
            "a b",
            "app:",
            "app:-x",
            "-app",
            "app@sha256:zz",
            "a//b",
            "ho_st.x/app",
        ] {
            assert!(!is_image_ref(bad), "{bad}");
        }
    }

    /// `IMAGE_REF_PATTERN` (within `IMAGE_REF_MAX_LEN`) says of these what
    /// `is_image_ref` says: the cases above and edges of each rule.
    #[test]
    fn the_image_pattern_gives_the_validators_verdicts() {
        let pattern = regex::Regex::new(IMAGE_REF_PATTERN).unwrap();
        let hex = "0123456789abcdef".repeat(4);
        let long_tag = format!("app:{}", "t".repeat(128));
        let longer_tag = format!("app:{}", "t".repeat(129));
        let long = format!("{}/app", "a".repeat(508));
        let longer = format!("{}/app", "a".repeat(509));
        let cases = [
            "busybox",
            "busybox:1.36",
            "library/busybox:latest",
            "registry.local:5000/team/app:v1.2_3",
            "localhost/app",
            "localhost",
            "localhost:5000/app",
            "capstan-test/busybox:1",
            "Busybox",
            "a b",
            "app:",
            "app:-x",
            "app:_x",
            "app:X.Y-z",
            "-app",
            "app-",
            "a..b",
            "a__b",
            "a/b/c/d",
            "a//b",
            "/app",
            "app/",
            "ho_st.x/app",
            "HOST.x/app",
            "h:/app",
            "./app",
            ".",
            "a.b",
            "a.b/c",
            "a_b/c",
            "a-b/c",
            "A/b",
            "a/B",
            "a:b/c",
            "a:b:c",
            "a/b:c",
            "a/b:c:d",
            "host:5000",
            "app@",
            "@sha256:x",
            "app@sha256:",
            "app@sha256:zz",
            "app@sha256:ABCDEF",
            "app@sha1:00",
            "a@b@c",
            "app:1@",
            "é",
            "app\n",
            "a/b.c/d:1",
            "a.b:1/c.d",
            "a-/b",
            "a/-b",
            "a/b-",
        ];
        let digests = [
            format!("app@sha256:{hex}"),
            format!("app:1@sha256:{hex}"),
            format!("r.io:1/a/b:c@sha256:{hex}"),
            format!("app@sha256:{hex}0"),
            format!("app@sha256:{}", &hex[1..]),
            format!("app@sha256:{}", hex.to_uppercase()),
        ];
        let mut verdicts = (0, 0);
        for image in cases
            .iter()
            .map(|c| c.to_string())
            .chain(digests)
            .chain([long_tag, longer_tag, long, longer])
        {
            let expected = is_image_ref(&image);
            let matched = image.len() <= IMAGE_REF_MAX_LEN && pattern.is_match(&image);
            assert_eq!(matched, expected, "{image:?}");
            if expected {
                verdicts.0 += 1
            } else {
                verdicts.1 += 1
            }
        }
        assert!(verdicts.0 >= 20 && verdicts.1 >= 30, "{verdicts:?}");
    }

    #[test]
    fn paths_and_volumes() {
        for ok in ["/", "/data", "/a/b.c/d"] {
            assert!(is_abs_path(ok), "{ok}");
        }
        for bad in ["", "data", "/a/../b", "/a\0", "/a\nb", "/a,b"] {
            assert!(!is_abs_path(bad), "{bad}");
        }
        assert!(is_volume_name("cache_1.v"));
        for bad in ["", "-v", "a/b", "a b"] {
            assert!(!is_volume_name(bad), "{bad}");
        }
    }

    proptest! {
        /// Strings of every character the grammar gives a role (and a few it gives
        /// none), shaped like references: the pattern and the validator agree.
        #[test]
        fn the_image_pattern_agrees_with_the_validator(
            s in "([a-zA-Z0-9._:@/-]{0,12}|[a-z0-9.:]{1,8}/[a-z0-9._-]{1,8}(:[A-Za-z0-9._-]{1,6})?(@sha256:[0-9a-f]{63,65})?| |é)",
        ) {
            let pattern = regex::Regex::new(IMAGE_REF_PATTERN).unwrap();
            let matched = s.len() <= IMAGE_REF_MAX_LEN && pattern.is_match(&s);
            prop_assert_eq!(matched, is_image_ref(&s), "{:?}", s);
        }

        #[test]
        fn dns_label_grammar_matches_definition(s in "[a-z0-9-]{0,70}") {
            let expect = !s.is_empty() && s.len() <= 63 && !s.starts_with('-') && !s.ends_with('-');
            prop_assert_eq!(is_dns_label(&s), expect);
        }

        /// Strings of name characters mixed with `=`, NUL, `-`, a space and a
        /// non-ASCII letter: the answer is exactly the documented grammar.
        #[test]
        fn env_name_grammar_matches_definition(s in "[A-Za-z0-9_=\\x00 é-]{0,20}") {
            let mut chars = s.chars();
            let expect = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            prop_assert_eq!(is_env_name(&s), expect, "{:?}", s);
        }

        /// A valid name with `=` or NUL put anywhere in it is never a name.
        #[test]
        fn env_names_never_contain_equals_or_nul(
            name in "[A-Za-z_][A-Za-z0-9_]{0,15}",
            bad in prop::sample::select(vec!['=', '\0']),
            at in any::<prop::sample::Index>(),
        ) {
            prop_assert!(is_env_name(&name));
            let mut s = name.clone();
            s.insert(at.index(name.len() + 1), bad);
            prop_assert!(!is_env_name(&s), "{:?}", s);
        }
    }
}
