//! What every verb shares: printing an answer (JSON or for people) and reading the
//! command line's durations and token.

use anyhow::Context as _;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) fn print(json: bool, value: &Value, human: impl FnOnce(&Value) -> String) {
    if json {
        println!("{value}");
    } else {
        print!("{}", human(value));
    }
}

/// An answer read as the `T` its request gives (what the human form is made of), while
/// `--json` prints it as it came (a newer coordinator's fields too).
pub(crate) fn typed<T: serde::de::DeserializeOwned>(answer: &Value) -> anyhow::Result<T> {
    T::deserialize(answer)
        .with_context(|| format!("the coordinator's answer is not what was asked for: {answer}"))
}

pub(crate) fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    capstan_coordinator::api::parse_duration(text)
        .with_context(|| format!("--{flag} {text:?} is not a duration (e.g. 30s, 2m)"))
}

/// The API token: `--token-file` / `$CAPSTAN_TOKEN_FILE`, else `$CAPSTAN_TOKEN`. Never
/// a command-line value, which other local users could read from the process list.
pub(crate) fn token(file: Option<&PathBuf>) -> anyhow::Result<Option<String>> {
    let token = match file {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the token file {}", file.display()))?;
            let token = text.lines().next().unwrap_or_default().trim().to_string();
            anyhow::ensure!(
                !token.is_empty(),
                "the token file {} is empty",
                file.display()
            );
            Some(token)
        }
        None => std::env::var("CAPSTAN_TOKEN")
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty()),
    };
    Ok(token)
}
