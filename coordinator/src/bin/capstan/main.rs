//! `capstan`: the operator's CLI, talking to a coordinator's HTTP API.
//!
//! Exit codes: 0 success; 1 a command failed or was rejected; 2 usage or transport
//! error; 3 a wait timed out before the command was done.
//!
//! This file holds the arguments and the dispatch; each group of verbs is a module:
//! `commands` (submit, wait, cancel, status), `hosts` (hosts, verify, intent,
//! register, keys, unregister), `log`, `rollout`, `install`; `output` what they share.

mod commands;
mod hosts;
mod install;
mod log;
mod output;
mod rollout;

use capstan_coordinator::client::Client;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "capstan",
    version,
    about = "capstan fleet CLI (talks to a coordinator)"
)]
struct Cli {
    /// The coordinator's base URL.
    #[arg(
        long,
        global = true,
        env = "CAPSTAN_COORDINATOR",
        default_value = "http://127.0.0.1:7400",
        value_name = "URL",
        value_parser = coordinator_url
    )]
    coordinator: String,
    /// A file holding the API token (first line). Default: `$CAPSTAN_TOKEN_FILE`, else
    /// the token itself from `$CAPSTAN_TOKEN`, else none.
    #[arg(long, global = true, env = "CAPSTAN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List hosts: alive, stale, gone, unverified or warming (as this coordinator hears their beats).
    Hosts,
    /// Submit commands from FILE (`-` = stdin): one JSON object, an array, or JSON lines.
    Submit {
        /// The commands: a JSON file, or `-` for stdin.
        file: PathBuf,
        /// Wait for each command to finish.
        #[arg(long)]
        wait: bool,
        /// Queue a command for a host the coordinator does not know (no registered
        /// key) instead of refusing it (`host_not_found`): a host being provisioned.
        #[arg(long)]
        queue_unknown_host: bool,
    },
    /// Wait for a command to finish and show it.
    Wait {
        /// The command's id.
        id: String,
        /// How long to wait (`500ms`, `30s`, `5m`); exit 3 when the command is not
        /// done by then.
        #[arg(long, default_value = "30s")]
        timeout: String,
    },
    /// Show a command's status and events.
    Status {
        /// The command's id.
        id: String,
    },
    /// Cut a command short on its host (a `cancel_command`); with `--wait`, wait for
    /// the command to end and show it (exit 0 once it is done, whatever its outcome;
    /// 3 when it is not done within `--timeout`).
    Cancel {
        /// The id of the command to cut short.
        id: String,
        /// Then wait for the command to end and show it.
        #[arg(long)]
        wait: bool,
        /// With `--wait`: how long to wait (exit 3 when it is not done by then).
        #[arg(long, default_value = "30s")]
        timeout: String,
    },
    /// Show a host's running intent (asks the agent).
    Intent {
        /// The host's name.
        host: String,
    },
    /// Show a host's audit log from the central event stream.
    Log {
        /// The host's name.
        host: String,
        /// Only records after this seq.
        #[arg(long, default_value_t = 0)]
        since: u64,
        /// Keep printing new records.
        #[arg(long)]
        follow: bool,
    },
    /// Compare a host's log with its records published in the central event stream:
    /// `ok`, or the first seq where it was rewritten, forked or truncated (exit 1).
    Verify {
        /// The host's name.
        host: String,
    },
    /// Register a host's public key (`capstan-agent host-key` prints it): what the
    /// coordinator checks everything the host publishes against. With `--file`, one
    /// `HOST KEY` pair a line (`#` comments), as `sim-fleet` writes them.
    Register {
        /// The host's name.
        host: Option<String>,
        /// Its public key: 64 hex digits.
        key: Option<String>,
        /// Register every `HOST KEY` line of this file instead.
        #[arg(long, conflicts_with_all = ["host", "key"])]
        file: Option<PathBuf>,
    },
    /// Show the public keys registered for a host.
    Keys {
        /// The host's name.
        host: String,
    },
    /// Remove one of a host's registered keys.
    Unregister {
        /// The host's name.
        host: String,
        /// The public key to remove: 64 hex digits.
        key: String,
    },
    /// Send the commands of FILE (without `host`) to many hosts, in order on each
    /// host (the next once the last succeeded there), wait, and summarise.
    Rollout {
        /// The commands, without `host`: a JSON file, or `-` for stdin.
        file: PathBuf,
        /// Comma-separated hosts, or `alive` for every alive host.
        #[arg(long)]
        hosts: String,
        /// How long each host's wait for each command may take.
        #[arg(long, default_value = "60s")]
        timeout: String,
        /// Requests in flight at once, submissions and waits alike (1 to 1024).
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1024))]
        concurrency: u16,
        /// List every host in the summary (by default only those that did not succeed).
        #[arg(long)]
        each: bool,
    },
    /// Install the capstan-agent PACKAGE (.deb) on hosts over SSH, write its config,
    /// enable and start it, and wait until each host is alive (its beat heard).
    Install(install::InstallArgs),
}

/// `--coordinator` (or `$CAPSTAN_COORDINATOR`): an `http://` or `https://` URL with a
/// host, said at once with what to write instead (rather than the HTTP client's
/// "relative URL without a base" on the first request).
fn coordinator_url(text: &str) -> Result<String, String> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(text.to_string()),
        Some(_) => Err(format!("{text:?} names no host")),
        None if text.contains("://") => Err(format!(
            "{text:?} is not an http:// or https:// URL (the coordinator's HTTP API)"
        )),
        None => Err(format!(
            "{text:?} is not a URL: say http://{text} (the coordinator's HTTP API)"
        )),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("capstan: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(real_main(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("capstan: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    let client = Client::new(&cli.coordinator, output::token(cli.token_file.as_ref())?);
    let json = cli.json;
    match cli.command {
        Cmd::Hosts => hosts::list(&client, json).await,
        Cmd::Submit {
            file,
            wait,
            queue_unknown_host,
        } => commands::submit(&client, json, &file, wait, queue_unknown_host).await,
        Cmd::Wait { id, timeout } => commands::wait(&client, json, &id, &timeout).await,
        Cmd::Cancel { id, wait, timeout } => {
            commands::cancel(&client, json, &id, wait, &timeout).await
        }
        Cmd::Status { id } => commands::status(&client, json, &id).await,
        Cmd::Verify { host } => hosts::verify(&client, json, &host).await,
        Cmd::Intent { host } => hosts::intent(&client, json, &host).await,
        Cmd::Log {
            host,
            since,
            follow,
        } => log::log(&client, json, &host, since, follow).await,
        Cmd::Rollout {
            file,
            hosts,
            timeout,
            concurrency,
            each,
        } => {
            let how = rollout::RolloutHow {
                timeout,
                concurrency: usize::from(concurrency),
                each,
            };
            rollout::rollout(&client, json, &file, &hosts, &how).await
        }
        Cmd::Install(args) => install::install(&client, json, args).await,
        Cmd::Register { host, key, file } => hosts::register(&client, json, host, key, file).await,
        Cmd::Keys { host } => hosts::keys(&client, json, &host).await,
        Cmd::Unregister { host, key } => hosts::unregister(&client, json, &host, &key).await,
    }
}

#[cfg(test)]
mod tests {
    use super::coordinator_url;

    /// Given the coordinator's address with and without a scheme, then a URL is taken
    /// and an address without one is refused saying what to write.
    #[test]
    fn the_coordinator_is_an_http_url() {
        for ok in [
            "http://127.0.0.1:7400",
            "https://capstan.example/",
            "http://[::1]:7400",
        ] {
            assert_eq!(coordinator_url(ok).as_deref(), Ok(ok));
        }
        assert_eq!(
            coordinator_url("127.0.0.1:7400").unwrap_err(),
            "\"127.0.0.1:7400\" is not a URL: say http://127.0.0.1:7400 (the coordinator's HTTP API)"
        );
        assert!(coordinator_url("nats://h:4222")
            .unwrap_err()
            .contains("not an http://"));
        assert!(coordinator_url("http://")
            .unwrap_err()
            .contains("names no host"));
    }
}
