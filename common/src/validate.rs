//! Grammar checks for every value that ends up in a name, a label, a unit file, a
//! container or a manifest. Hand-written (no regex engine): each is a few lines and
//! the grammar is in its doc comment.

use crate::{DriverKind, ErrorCode, Rejection, Spec};

mod image;
#[cfg(test)]
mod tests;

pub use image::{is_image_ref, IMAGE_REF_MAX_LEN, IMAGE_REF_PATTERN};

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

/// Checks what every driver's spec shares: env grammar, argv without NUL, paths,
/// ports, readiness bounds, the image reference's grammar, and that the only section
/// is the spec's own driver's (a JSON object). The driver checks the rest when its
/// agent takes the command in (`Driver::check_spec`).
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
    sections(spec)?;
    if let Some(readiness) = &spec.readiness {
        crate::readiness::validate(readiness)?;
    }
    match &spec.image {
        Some(image) if !is_image_ref(image) => Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "`image` {:?} is not a valid image reference",
                truncate(image)
            ),
        )),
        _ => Ok(()),
    }
}

/// A spec carries at most one section: its own driver's, a JSON object. Any other
/// name is a field no spec has, or the settings of another driver.
fn sections(spec: &Spec) -> Result<(), Rejection> {
    let invalid = |m: String| Err(Rejection::new(ErrorCode::InvalidSpec, m));
    for (name, section) in spec.sections.iter() {
        if name != spec.driver.as_str() {
            // Even empty: a misspelt field is refused whatever it holds.
            return match DriverKind::new(name) {
                Ok(other) if other.is_built_in() => invalid(format!(
                    "`{name}` settings are only for driver {name}; this spec is for {}",
                    spec.driver
                )),
                _ => invalid(format!(
                    "`{}` is not a field of a spec, nor the section of its driver {}",
                    truncate(name),
                    spec.driver
                )),
            };
        }
        if !section.is_object() {
            return invalid(format!("`{name}` (the driver's section) must be an object"));
        }
    }
    Ok(())
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

/// At most 64 characters of `s`, to name a bad value in a message.
pub fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The rule of a driver with no settings of its own (sim, docker): a spec for it
/// carries no section with any (`{}` is none).
pub fn no_settings(spec: &Spec) -> Result<(), Rejection> {
    match spec.section().filter(|s| !s.is_empty_object()) {
        Some(_) => Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "driver {kind} has no settings of its own: leave `{kind}` out",
                kind = spec.driver
            ),
        )),
        None => Ok(()),
    }
}
