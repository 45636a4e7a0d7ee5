//! Admission of commands that arrive over NATS: parse and validate, then check the
//! coordinator's signature and the command's age against the `[signing]` config.
//! The executor checks the host (`wrong_host`) and answers known ids from the log.

use capstan_common::signing::{self, KeyError, Policy};
use capstan_common::{Command, ErrorCode, Rejection};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use std::time::Duration;

/// The `[signing]` section of `agent.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningConfig {
    /// Trusted coordinator public keys (hex, from `capstan-coordinator keygen`).
    #[serde(default)]
    pub public_keys: Vec<String>,
    /// Accept unsigned commands. For development only; off by default.
    #[serde(default)]
    pub allow_unsigned: bool,
    /// Commands issued longer ago than this are rejected (`expired`), unless the log
    /// already holds them (a redelivery is answered from the log).
    #[serde(default = "default_max_age")]
    pub max_age_secs: u64,
    /// Commands issued further than this in the future are rejected.
    #[serde(default = "default_max_skew")]
    pub max_skew_secs: u64,
}

fn default_max_age() -> u64 {
    3600
}

fn default_max_skew() -> u64 {
    60
}

impl Default for SigningConfig {
    fn default() -> Self {
        SigningConfig {
            public_keys: Vec::new(),
            allow_unsigned: false,
            max_age_secs: default_max_age(),
            max_skew_secs: default_max_skew(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error("[signing] public_keys[{index}] is not a usable key")]
    Key {
        index: usize,
        #[source]
        source: KeyError,
    },
    #[error("[signing] has no public_keys: set them (or allow_unsigned = true for development)")]
    NoKeys,
}

impl SigningConfig {
    pub fn policy(&self) -> Result<Policy, AuthConfigError> {
        let keys = self
            .public_keys
            .iter()
            .enumerate()
            .map(|(index, k)| {
                signing::public_key(k).map_err(|source| AuthConfigError::Key { index, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() && !self.allow_unsigned {
            return Err(AuthConfigError::NoKeys);
        }
        Ok(Policy {
            keys,
            allow_unsigned: self.allow_unsigned,
            max_age: Duration::from_secs(self.max_age_secs),
            max_skew: Duration::from_secs(self.max_skew_secs),
        })
    }
}

/// A command that may not be carried out: the id to report it under (when the input
/// had a readable one) and why.
pub type Refusal = (Option<String>, Rejection);

/// Parses `text` and checks its signature and age. `known` says whether the log
/// already holds this id: a known command is past its admission, so only its
/// signature is checked again (an old redelivery is answered, not rejected).
pub fn admit(
    policy: &Policy,
    text: &str,
    now: DateTime<Utc>,
    known: impl FnOnce(&str) -> bool,
) -> Result<Command, Refusal> {
    let command = Command::parse(text).map_err(|r| (capstan_common::salvage_id(text), r))?;
    let sig = signing::sig_field(text);
    match policy.authorize(&command, sig.as_deref(), now) {
        Ok(()) => Ok(command),
        Err(r) if r.code == ErrorCode::Expired && known(&command.id) => Ok(command),
        Err(r) => Err((Some(command.id), r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_common::signing::Signer;

    #[test]
    fn no_keys_means_no_policy_unless_unsigned_is_allowed() {
        assert!(matches!(
            SigningConfig::default().policy(),
            Err(AuthConfigError::NoKeys)
        ));
        let dev = SigningConfig {
            allow_unsigned: true,
            ..SigningConfig::default()
        };
        assert!(dev.policy().is_ok());
        let bad = SigningConfig {
            public_keys: vec!["nope".into()],
            ..SigningConfig::default()
        };
        assert!(matches!(
            bad.policy(),
            Err(AuthConfigError::Key { index: 0, .. })
        ));
    }

    #[test]
    fn an_expired_command_the_log_knows_is_admitted() {
        let signer = Signer::generate().unwrap();
        let policy = SigningConfig {
            public_keys: vec![signer.public_hex()],
            max_age_secs: 10,
            ..SigningConfig::default()
        }
        .policy()
        .unwrap();
        let old = Command::parse(
            r#"{"v":1,"id":"c-9","host":"h1","issued_at":"2020-01-01T00:00:00Z","op":"ensure_namespace","namespace":"ns"}"#,
        )
        .unwrap();
        let wire = signer.signed_json(&old);
        let now = Utc::now();
        let (id, r) = admit(&policy, &wire, now, |_| false).unwrap_err();
        assert_eq!((id.as_deref(), r.code), (Some("c-9"), ErrorCode::Expired));
        assert_eq!(admit(&policy, &wire, now, |_| true).unwrap(), old);
        let (id, r) = admit(&policy, "{", now, |_| true).unwrap_err();
        assert_eq!((id, r.code), (None, ErrorCode::InvalidJson));
    }
}
