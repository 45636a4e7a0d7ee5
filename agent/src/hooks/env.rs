//! The launch environment rules, applied once to the merged result of every owner's
//! `before_workload_start` reply. A rejection says which rule broke, never a name or
//! a value (a hook chooses both, so either could carry something sensitive).

use capstan_driver::LaunchEnv;
use std::collections::BTreeMap;

/// The most entries a launch environment may hold.
pub const MAX_ENTRIES: usize = 64;

/// Names a launch environment may never set (docs/hooks.md has the table of why):
/// the process's own layout, loaders and interpreters that run or load code named by a
/// variable, proxies and trust stores that redirect or intercept traffic, shell
/// variables that change how scripts parse or trace, and the agent's own settings.
const RESERVED: &[&str] = &[
    // the process layout
    "HOME",
    "PATH",
    "TMPDIR",
    // interpreter code injection
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    // libc loading
    "GCONV_PATH",
    "LOCPATH",
    // shells
    "BASH_ENV",
    "ENV",
    "IFS",
    "SHELL",
    "SHELLOPTS",
    "PS4",
    "PROMPT_COMMAND",
    // traffic: proxies and trust stores
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "FTP_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    // logging and tracing
    "LOG_FORMAT",
    "RUST_LOG",
];
/// Name prefixes a launch environment may never use.
const RESERVED_PREFIXES: &[&str] = &["XDG_", "LD_", "DYLD_", "OTEL_", "CAPSTAN_"];

/// Which rule the merged environment broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnvRejection {
    #[error("more than 64 entries")]
    TooMany,
    #[error("a name breaks ^[A-Z_][A-Z0-9_]{{0,127}}$")]
    BadName,
    #[error("a name is reserved")]
    Reserved,
    #[error("a value breaks ^opaque-[A-Za-z0-9][A-Za-z0-9._:-]{{0,127}}$")]
    BadValue,
    #[error("a name is also set by the revision's spec env")]
    CollidesWithSpec,
}

/// `^[A-Z_][A-Z0-9_]{0,127}$`
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=128).contains(&b.len())
        && (b[0].is_ascii_uppercase() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
}

fn reserved(name: &str) -> bool {
    RESERVED.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// `^opaque-[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`
fn valid_value(value: &str) -> bool {
    let Some(rest) = value.strip_prefix("opaque-") else {
        return false;
    };
    let b = rest.as_bytes();
    (1..=128).contains(&b.len())
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

/// Merges replies in owner order (a later owner overrides an earlier one's name).
pub fn merge(into: &mut BTreeMap<String, String>, reply: BTreeMap<String, String>) {
    into.extend(reply);
}

/// Checks the final merged environment against every rule and the spec's own env,
/// and returns the accepted, detached copy the driver projects.
pub fn accept(
    merged: &BTreeMap<String, String>,
    spec_env: &BTreeMap<String, String>,
) -> Result<LaunchEnv, EnvRejection> {
    if merged.len() > MAX_ENTRIES {
        return Err(EnvRejection::TooMany);
    }
    for (name, value) in merged {
        if !valid_name(name) {
            return Err(EnvRejection::BadName);
        }
        if reserved(name) {
            return Err(EnvRejection::Reserved);
        }
        if !valid_value(value) {
            return Err(EnvRejection::BadValue);
        }
        if spec_env.contains_key(name) {
            return Err(EnvRejection::CollidesWithSpec);
        }
    }
    Ok(merged.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn check(pairs: &[(&str, &str)]) -> Result<LaunchEnv, EnvRejection> {
        accept(&env(pairs), &BTreeMap::new())
    }

    #[test]
    fn good_entries_pass() {
        assert!(check(&[("DB_TOKEN", "opaque-abc.1:2_3-4"), ("_X", "opaque-Z")]).is_ok());
        let long_name = format!("A{}", "B".repeat(127));
        let long_value = format!("opaque-a{}", "b".repeat(127));
        assert!(check(&[(&long_name, &long_value)]).is_ok());
    }

    #[test]
    fn each_rule_rejects() {
        use EnvRejection::*;
        for (pairs, want) in [
            (vec![("HOME", "opaque-x")], Reserved),
            (vec![("LD_PRELOAD", "opaque-x")], Reserved),
            (vec![("CAPSTAN_X", "opaque-x")], Reserved),
            (vec![("XDG_RUNTIME_DIR", "opaque-x")], Reserved),
            (vec![("OTEL_ENDPOINT", "opaque-x")], Reserved),
            (vec![("lower", "opaque-x")], BadName),
            (vec![("1ABC", "opaque-x")], BadName),
            (vec![("", "opaque-x")], BadName),
            (vec![("A-B", "opaque-x")], BadName),
            (vec![("TOKEN", "secret")], BadValue),
            (vec![("TOKEN", "opaque-")], BadValue),
            (vec![("TOKEN", "opaque-.x")], BadValue),
            (vec![("TOKEN", "opaque-a b")], BadValue),
        ] {
            assert_eq!(check(&pairs), Err(want), "{pairs:?}");
        }
        let too_long = format!("A{}", "B".repeat(128));
        assert_eq!(check(&[(&too_long, "opaque-x")]), Err(BadName));
        let too_long = format!("opaque-a{}", "b".repeat(128));
        assert_eq!(check(&[("T", &too_long)]), Err(BadValue));
    }

    #[test]
    fn proxies_trust_stores_interpreters_and_shell_variables_are_reserved() {
        let names = "HTTP_PROXY HTTPS_PROXY ALL_PROXY NO_PROXY FTP_PROXY \
            PYTHONPATH PYTHONSTARTUP PYTHONHOME PERL5LIB PERL5OPT RUBYOPT RUBYLIB \
            JAVA_TOOL_OPTIONS _JAVA_OPTIONS JDK_JAVA_OPTIONS CLASSPATH GCONV_PATH LOCPATH \
            SSL_CERT_FILE SSL_CERT_DIR CURL_CA_BUNDLE IFS SHELL SHELLOPTS PS4 PROMPT_COMMAND \
            HOME PATH TMPDIR NODE_OPTIONS NODE_PATH BASH_ENV ENV LOG_FORMAT RUST_LOG \
            XDG_CONFIG_HOME LD_LIBRARY_PATH DYLD_INSERT_LIBRARIES OTEL_EXPORTER_OTLP_ENDPOINT \
            CAPSTAN_HOST";
        for name in names.split_whitespace() {
            assert_eq!(
                check(&[(name, "opaque-x")]),
                Err(EnvRejection::Reserved),
                "{name}"
            );
        }
        // Only the exact names: a longer name that merely starts with one is fine.
        assert!(check(&[("HTTP_PROXY_TOKEN", "opaque-x"), ("SHELLX", "opaque-x")]).is_ok());
    }

    #[test]
    fn sixty_five_entries_are_too_many() {
        let names: Vec<String> = (0..65).map(|i| format!("V{i}")).collect();
        let pairs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "opaque-x")).collect();
        assert_eq!(check(&pairs), Err(EnvRejection::TooMany));
        assert!(check(&pairs[..64]).is_ok());
    }

    #[test]
    fn a_name_the_spec_sets_is_rejected() {
        let spec = env(&[("TOKEN", "plain")]);
        assert_eq!(
            accept(&env(&[("TOKEN", "opaque-x")]), &spec),
            Err(EnvRejection::CollidesWithSpec)
        );
    }
}
