//! `capstan`: the operator's CLI, talking to a coordinator's HTTP API.
//!
//! Exit codes: 0 success; 1 a command failed or was rejected; 2 usage or transport
//! error; 3 a wait timed out before the command was done.

use anyhow::Context as _;
use capstan_coordinator::client::Client;
use capstan_coordinator::rollout;
use capstan_coordinator::verify::{Finding, Verdict};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
        default_value = "http://127.0.0.1:7400"
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
    /// List hosts: alive, stale or gone.
    Hosts,
    /// Submit commands from FILE (`-` = stdin): one JSON object, an array, or JSON lines.
    Submit {
        file: PathBuf,
        /// Wait for each command to finish.
        #[arg(long)]
        wait: bool,
    },
    /// Wait for a command to finish and show it.
    Wait {
        id: String,
        #[arg(long, default_value = "30s")]
        timeout: String,
    },
    /// Show a command's status and events.
    Status { id: String },
    /// Cut a command short on its host (a `cancel_command`); with `--wait`, wait for
    /// the command to end and show it (exit 0 once it is done, whatever its outcome;
    /// 3 when it is not done within `--timeout`).
    Cancel {
        id: String,
        #[arg(long)]
        wait: bool,
        #[arg(long, default_value = "30s")]
        timeout: String,
    },
    /// Show a host's running intent (asks the agent).
    Intent { host: String },
    /// Show a host's audit log from the central event stream.
    Log {
        host: String,
        #[arg(long, default_value_t = 0)]
        since: u64,
        /// Keep printing new records.
        #[arg(long)]
        follow: bool,
    },
    /// Compare a host's log with its records published in the central event stream:
    /// `ok`, or the first seq where it was rewritten, forked or truncated (exit 1).
    Verify { host: String },
    /// Register a host's public key (`capstan-agent host-key` prints it): what the
    /// coordinator checks everything the host publishes against. With `--file`, one
    /// `HOST KEY` pair a line (`#` comments), as `sim-fleet` writes them.
    Register {
        host: Option<String>,
        key: Option<String>,
        #[arg(long, conflicts_with_all = ["host", "key"])]
        file: Option<PathBuf>,
    },
    /// Show the public keys registered for a host.
    Keys { host: String },
    /// Remove one of a host's registered keys.
    Unregister { host: String, key: String },
    /// Send one command (FILE, without `host`) to many hosts, wait, and summarise.
    Rollout {
        file: PathBuf,
        /// Comma-separated hosts, or `alive` for every alive host.
        #[arg(long)]
        hosts: String,
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
    /// enable and start it, and wait until each host is alive in the registry.
    Install(InstallArgs),
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["ssh", "hosts_file"])))]
#[command(group(clap::ArgGroup::new("trust").required(true).multiple(true).args(["known_hosts", "accept_new"])))]
#[command(group(clap::ArgGroup::new("what").required(true).args(["config", "config_dir"])))]
struct InstallArgs {
    /// One host: `user@host[:port]` (port 22 by default).
    #[arg(long)]
    ssh: Option<String>,
    /// Many hosts: a file with one `user@host[:port]` a line (`#` comments).
    #[arg(long)]
    hosts_file: Option<PathBuf>,
    /// The SSH private key (OpenSSH ed25519, no passphrase).
    #[arg(long)]
    identity: PathBuf,
    /// The known_hosts file host keys are checked against (OpenSSH format).
    #[arg(long)]
    known_hosts: Option<PathBuf>,
    /// Trust a host that known_hosts does not name yet, and record its key there
    /// (default file: ~/.ssh/known_hosts). A changed key is refused all the same.
    #[arg(long)]
    accept_new: bool,
    /// The agent.toml every host gets.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A directory with `<host>.toml` for each host (`host` as written in the target).
    #[arg(long)]
    config_dir: Option<PathBuf>,
    /// Replace a different installed version of the package (the agent stops
    /// leaving its workloads running, and starts again).
    #[arg(long)]
    upgrade: bool,
    /// The output directory of `capstan-coordinator nats-config`: each host's nkey
    /// seed (`credentials/<host>.nk`) is written to /etc/capstan/nats.nk, which the
    /// config's `[nats] nkey_seed_file` must name (with `host_accounts = true`).
    #[arg(long, value_name = "DIR")]
    nats_credentials: Option<PathBuf>,
    /// Replace an installed version with an older one, when the package reads the
    /// storage layout of the host's log (its X-Capstan-Log-Layouts).
    #[arg(long)]
    allow_downgrade: bool,
    /// How many hosts at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// How long a host may take to be alive once its agent is started.
    #[arg(long, default_value = "60s")]
    timeout: String,
    /// How long connecting to a host (TCP and the SSH handshake) may take.
    #[arg(long, default_value = "10s")]
    connect_timeout: String,
    /// The capstan-agent .deb.
    package: PathBuf,
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

fn read_input(file: &PathBuf) -> anyhow::Result<Vec<Value>> {
    let mut text = String::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text)?;
    } else {
        text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
    }
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        return Ok(match value {
            Value::Array(items) => items,
            other => vec![other],
        });
    }
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("line {} is not JSON", i + 1))
        })
        .collect()
}

/// An answer that is not what was asked for is an error, never printed as the truth
/// (an empty log, an empty intent).
fn expect_events(page: &Value) -> anyhow::Result<Vec<Value>> {
    match page["events"].as_array() {
        Some(events) => Ok(events.clone()),
        None => anyhow::bail!("the coordinator's answer has no events: {page}"),
    }
}

/// The agent's intent, or an error when the answer is not one (an error reply, `{}`).
fn expect_intent(intent: Value) -> anyhow::Result<Value> {
    if let Some(error) = intent.get("error") {
        anyhow::bail!("the agent answered with an error: {error}");
    }
    if !intent["applied_seq"].is_u64() {
        anyhow::bail!("the agent's answer is not an intent: {intent}");
    }
    Ok(intent)
}

fn print(json: bool, value: &Value, human: impl FnOnce(&Value) -> String) {
    if json {
        println!("{value}");
    } else {
        print!("{}", human(value));
    }
}

fn human_verdict(v: &Verdict) -> String {
    let (host, published) = (v.host_seq, v.published_seq);
    match (&v.result, &v.first_difference) {
        (Finding::Ok, _) => format!(
            "ok: {} records of {} equal on the host and in CAPSTAN_EVT (host at seq {host}, published up to {published}{})\n",
            v.compared,
            v.host,
            v.anchor_seq
                .map(|a| format!("; compared after the host's anchor at seq {a}"))
                .unwrap_or_default()
        ),
        (Finding::Truncated, d) => format!(
            "TRUNCATED at seq {}: the log of {} ends at seq {host}, CAPSTAN_EVT holds records up to {published}\n",
            d.as_ref().map_or(0, |d| d.seq),
            v.host
        ),
        (Finding::Differs, d) => {
            let show = |r: Option<&Value>| r.map_or("-".into(), Value::to_string);
            let d = d.as_ref();
            format!(
                "DIFFERS at seq {}: the log of {} was rewritten or forked after publication\n  host:      {}\n  published: {}\n",
                d.map_or(0, |d| d.seq),
                v.host,
                show(d.and_then(|d| d.host.as_ref())),
                show(d.and_then(|d| d.published.as_ref()))
            )
        }
    }
}

fn status_code(status: &Value) -> ExitCode {
    match status["status"].as_str() {
        Some("succeeded") => ExitCode::SUCCESS,
        Some("failed" | "rejected") => ExitCode::from(1),
        _ => ExitCode::from(3),
    }
}

fn human_cancel(a: &Value) -> String {
    let command = &a["command"];
    let (id, status) = (
        command["id"].as_str().unwrap_or("-"),
        command["status"].as_str().unwrap_or("-"),
    );
    match a["cancel_id"].as_str() {
        Some(cancel) => format!("{id}  cancel={cancel} sent  (status was {status})\n"),
        None => format!("{id}  is done ({status}): nothing to cancel\n"),
    }
}

fn human_status(s: &Value) -> String {
    let mut out = format!(
        "{}  host={}  status={}",
        s["id"].as_str().unwrap_or("-"),
        s["host"].as_str().unwrap_or("-"),
        s["status"].as_str().unwrap_or("-")
    );
    if let Some(e) = s["error"].as_object() {
        out.push_str(&format!(
            "  error={}: {}",
            e["code"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        ));
    }
    out.push('\n');
    for e in s["events"].as_array().into_iter().flatten() {
        out.push_str(&event_line(e));
    }
    out
}

fn event_line(e: &Value) -> String {
    let target = ["namespace", "workload", "revision"]
        .iter()
        .filter_map(|k| e[*k].as_str())
        .collect::<Vec<_>>()
        .join("/");
    let detail = ["outcome", "code", "cause"]
        .iter()
        .filter_map(|k| {
            e.get(*k)
                .filter(|v| !v.is_null())
                .map(|v| format!("{k}={v}"))
        })
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "  {:>6}  {:<24}  {:<18}  {:<20}  {:<28}  {}\n",
        e["seq"],
        e["at"].as_str().unwrap_or(""),
        e["kind"].as_str().unwrap_or(""),
        e["command_id"].as_str().unwrap_or("-"),
        target,
        detail
    )
}

/// The API token: `--token-file` / `$CAPSTAN_TOKEN_FILE`, else `$CAPSTAN_TOKEN`. Never
/// a command-line value, which other local users could read from the process list.
fn token(file: Option<&PathBuf>) -> anyhow::Result<Option<String>> {
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

async fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    let client = Client::new(&cli.coordinator, token(cli.token_file.as_ref())?);
    let json = cli.json;
    match cli.command {
        Cmd::Hosts => {
            let hosts = client.get("/v1/hosts").await?;
            print(json, &hosts, |v| {
                let mut out = format!(
                    "{:<20} {:<6} {:>6} {:<10} {:<10} {:>8}\n",
                    "HOST", "STATUS", "AGE", "VERSION", "DRIVERS", "LAST_SEQ"
                );
                for h in v["hosts"].as_array().into_iter().flatten() {
                    let beat = &h["beat"];
                    out.push_str(&format!(
                        "{:<20} {:<6} {:>6} {:<10} {:<10} {:>8}\n",
                        h["host"].as_str().unwrap_or(""),
                        h["status"].as_str().unwrap_or(""),
                        h["age_secs"]
                            .as_i64()
                            .map(|a| format!("{a}s"))
                            .unwrap_or("-".into()),
                        beat["version"].as_str().unwrap_or("-"),
                        beat["drivers"]
                            .as_array()
                            .map(|d| d
                                .iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join(","))
                            .unwrap_or("-".into()),
                        beat["last_seq"]
                            .as_u64()
                            .map(|s| s.to_string())
                            .unwrap_or("-".into()),
                    ));
                }
                out
            });
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Submit { file, wait } => {
            let mut code = ExitCode::SUCCESS;
            for command in read_input(&file)? {
                let accepted = client.post("/v1/commands", &command).await?;
                let id = accepted["id"].as_str().unwrap_or_default().to_string();
                if wait {
                    let s = client
                        .get(&format!("/v1/commands/{id}/wait?timeout=60s"))
                        .await?;
                    print(json, &s, human_status);
                    if status_code(&s) != ExitCode::SUCCESS {
                        code = status_code(&s);
                    }
                } else {
                    print(json, &accepted, |v| {
                        format!("{}\n", v["id"].as_str().unwrap_or(""))
                    });
                }
            }
            Ok(code)
        }
        Cmd::Wait { id, timeout } => {
            let s = client
                .get(&format!("/v1/commands/{id}/wait?timeout={timeout}"))
                .await?;
            print(json, &s, human_status);
            Ok(status_code(&s))
        }
        Cmd::Cancel { id, wait, timeout } => {
            let answer = client
                .post(&format!("/v1/commands/{id}/cancel"), &serde_json::json!({}))
                .await?;
            if !wait {
                print(json, &answer, human_cancel);
                return Ok(ExitCode::SUCCESS);
            }
            let s = client
                .get(&format!("/v1/commands/{id}/wait?timeout={timeout}"))
                .await?;
            print(json, &s, human_status);
            Ok(match s["done"].as_bool() {
                Some(true) => ExitCode::SUCCESS,
                _ => ExitCode::from(3),
            })
        }
        Cmd::Status { id } => {
            let s = client.get(&format!("/v1/commands/{id}")).await?;
            print(json, &s, human_status);
            Ok(match s["status"].as_str() {
                Some("failed" | "rejected") => ExitCode::from(1),
                _ => ExitCode::SUCCESS,
            })
        }
        Cmd::Verify { host } => {
            let value = client.get(&format!("/v1/hosts/{host}/verify")).await?;
            let verdict: Verdict = serde_json::from_value(value.clone())
                .context("the coordinator's verdict is unreadable")?;
            print(json, &value, |_| human_verdict(&verdict));
            Ok(match verdict.result {
                Finding::Ok => ExitCode::SUCCESS,
                Finding::Differs | Finding::Truncated => ExitCode::from(1),
            })
        }
        Cmd::Intent { host } => {
            let intent = client.get(&format!("/v1/hosts/{host}/intent")).await?;
            let intent = expect_intent(intent)?;
            print(json, &intent, |v| {
                serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
            });
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Log {
            host,
            since,
            follow,
        } => log(&client, json, &host, since, follow).await,
        Cmd::Rollout {
            file,
            hosts,
            timeout,
            concurrency,
            each,
        } => {
            let how = RolloutHow {
                timeout,
                concurrency: usize::from(concurrency),
                each,
            };
            rollout(&client, json, &file, &hosts, &how).await
        }
        Cmd::Install(args) => install(&client, json, args).await,
        Cmd::Register { host, key, file } => register(&client, json, host, key, file).await,
        Cmd::Keys { host } => {
            let entry = client.get(&format!("/v1/hosts/{host}/keys")).await?;
            print(json, &entry, human_keys);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Unregister { host, key } => {
            let entry = client
                .delete(&format!("/v1/hosts/{host}/keys/{key}"))
                .await?;
            print(json, &entry, human_keys);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `capstan register HOST KEY` or `--file FILE`: each pair through
/// `PUT /v1/hosts/{host}/keys`; one line (or JSON object) per host.
async fn register(
    client: &Client,
    json: bool,
    host: Option<String>,
    key: Option<String>,
    file: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let pairs: Vec<(String, String)> = match (host, key, file) {
        (Some(h), Some(k), None) => vec![(h, k)],
        (None, None, Some(f)) => {
            let text = std::fs::read_to_string(&f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            let mut pairs = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                match line.split_whitespace().collect::<Vec<_>>()[..] {
                    [h, k] => pairs.push((h.to_string(), k.to_string())),
                    _ => anyhow::bail!("{}:{}: expected `HOST KEY`", f.display(), n + 1),
                }
            }
            pairs
        }
        _ => anyhow::bail!("give HOST and KEY, or --file FILE"),
    };
    for (host, key) in pairs {
        let entry = client
            .put(
                &format!("/v1/hosts/{host}/keys"),
                &json!({"public_key": key}),
            )
            .await?;
        print(json, &entry, human_keys);
    }
    Ok(ExitCode::SUCCESS)
}

fn human_keys(entry: &Value) -> String {
    let keys: Vec<&str> = entry["public_keys"]
        .as_array()
        .map(|k| k.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    format!(
        "{} {}\n",
        entry["host"].as_str().unwrap_or("?"),
        if keys.is_empty() {
            "(no keys)".to_string()
        } else {
            keys.join(" ")
        }
    )
}

/// `capstan log HOST [--since SEQ] [--follow]`: the host's records from `CAPSTAN_EVT`,
/// page by page; following, new ones as they arrive, until interrupted.
async fn log(
    client: &Client,
    json: bool,
    host: &str,
    mut since: u64,
    follow: bool,
) -> anyhow::Result<ExitCode> {
    // Following, an outage of the coordinator (or of its NATS) is waited out:
    // said once on stderr, then retried every second from where it was.
    let mut outage = false;
    loop {
        let page = match client
            .get(&format!("/v1/hosts/{host}/events?since={since}"))
            .await
        {
            Err(e) if follow && e.transient() => {
                if !outage {
                    eprintln!(
                        "capstan: {:#}; retrying every second",
                        anyhow::Error::new(e)
                    );
                    outage = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            page => page?,
        };
        if std::mem::take(&mut outage) {
            eprintln!("capstan: following again from seq {since}");
        }
        let events = expect_events(&page)?;
        let mut out = std::io::stdout().lock();
        for e in &events {
            if json {
                writeln!(out, "{e}")?;
            } else {
                write!(out, "{}", event_line(e))?;
            }
            since = since.max(e["seq"].as_u64().unwrap_or(since));
        }
        out.flush()?;
        // Page after page until one is short of a full page (the API fills every page
        // it can): the whole log, never its first page as if it were all.
        let short = events.len() < capstan_coordinator::api::MAX_EVENTS;
        if short && !follow {
            return Ok(ExitCode::SUCCESS);
        }
        if events.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    capstan_coordinator::api::parse_duration(text)
        .with_context(|| format!("--{flag} {text:?} is not a duration (e.g. 30s, 2m)"))
}

/// `capstan install`: one summary line per host on stdout (`<host> installed`,
/// `upgraded`, `downgraded`, `reconfigured`, `unchanged`, or `failed: <reason>`); exit 1 if any
/// host failed.
async fn install(client: &Client, json: bool, args: InstallArgs) -> anyhow::Result<ExitCode> {
    use capstan_coordinator::install::{self, ssh, target};
    let targets = match (&args.ssh, &args.hosts_file) {
        (Some(one), _) => vec![one.parse::<target::Target>()?],
        (None, Some(file)) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the hosts file {}", file.display()))?;
            target::parse_hosts_file(&text)
                .with_context(|| format!("in the hosts file {}", file.display()))?
        }
        (None, None) => anyhow::bail!("pass --ssh user@host or --hosts-file FILE"),
    };
    let known_hosts = match args.known_hosts {
        Some(path) => path,
        None => std::env::home_dir()
            .context("no home directory for ~/.ssh/known_hosts: pass --known-hosts FILE")?
            .join(".ssh/known_hosts"),
    };
    let mut jobs = Vec::new();
    for target in targets {
        let path = match (&args.config, &args.config_dir) {
            (Some(file), _) => file.clone(),
            (None, Some(dir)) => dir.join(format!("{}.toml", target.host)),
            (None, None) => anyhow::bail!("pass --config FILE or --config-dir DIR"),
        };
        let config = std::fs::read(&path).with_context(|| {
            format!(
                "cannot read the config for {} ({})",
                target.host,
                path.display()
            )
        })?;
        // A config that is not TOML is a usage error, found before any host is touched.
        toml::from_str::<toml::Table>(&String::from_utf8_lossy(&config))
            .with_context(|| format!("the config {} is not TOML", path.display()))?;
        jobs.push(install::Job { target, config });
    }
    let package_bytes = std::fs::read(&args.package)
        .with_context(|| format!("cannot read the package {}", args.package.display()))?;
    let spec = install::Install {
        identity: ssh::load_identity(&args.identity)?,
        identity_path: args.identity,
        host_keys: ssh::HostKeys {
            known_hosts,
            accept_new: args.accept_new,
        },
        package: args.package,
        package_bytes: std::sync::Arc::new(package_bytes),
        upgrade: args.upgrade,
        nats_credentials: args.nats_credentials,
        allow_downgrade: args.allow_downgrade,
        connect_timeout: duration("connect-timeout", &args.connect_timeout)?,
        timeout: duration("timeout", &args.timeout)?,
    };
    let results = install::install_all(&spec, client, jobs, args.concurrency).await;
    let mut failed = false;
    for (host, result) in results {
        match result {
            Ok(outcome) if json => {
                println!("{}", json!({"host": host, "outcome": outcome.to_string()}))
            }
            Ok(outcome) => println!("{host} {outcome}"),
            Err(e) => {
                failed = true;
                let reason = format!("{:#}", anyhow::Error::new(e));
                if json {
                    println!(
                        "{}",
                        json!({"host": host, "outcome": "failed", "error": reason})
                    );
                } else {
                    println!("{host} failed: {reason}");
                }
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// How `rollout` goes about it (its flags).
struct RolloutHow {
    timeout: String,
    /// Requests in flight at once.
    concurrency: usize,
    /// A line for every host, not only those that did not succeed.
    each: bool,
}

/// Hosts listed in the human summary when `--each` is not given: those that did not
/// succeed, up to this many.
const ROLLOUT_LISTED: usize = 20;

/// `capstan rollout`: [`rollout::run`] with a progress bar on stderr and a summary.
async fn rollout(
    client: &Client,
    json: bool,
    file: &PathBuf,
    hosts: &str,
    how: &RolloutHow,
) -> anyhow::Result<ExitCode> {
    let template = read_input(file)?
        .into_iter()
        .next()
        .context("the rollout file holds no command")?;
    let hosts: Vec<String> = if hosts == "alive" {
        client.get("/v1/hosts").await?["hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|h| h["status"] == "alive")
            .filter_map(|h| h["host"].as_str().map(str::to_string))
            .collect()
    } else {
        hosts
            .split(',')
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect()
    };
    anyhow::ensure!(!hosts.is_empty(), "no hosts to roll out to");
    let plan = rollout::Plan {
        template,
        hosts,
        timeout: duration("timeout", &how.timeout)?,
        concurrency: how.concurrency,
    };
    let summary = rollout::run(client, &plan, draw).await?;
    let _ = writeln!(std::io::stderr());
    print(json, &summary, |v| human_rollout(v, how.each));
    Ok(if summary["succeeded"] == summary["total"] {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The rollout's summary: a line for each host that did not succeed (the first
/// [`ROLLOUT_LISTED`], or every host with `each`), then the count.
fn human_rollout(v: &Value, each: bool) -> String {
    let results = v["results"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let listed: Vec<&Value> = results
        .iter()
        .filter(|s| each || s["status"] != "succeeded")
        .collect();
    let mut out = String::new();
    if !listed.is_empty() {
        out.push_str(&format!(
            "{:<20} {:<10} {:<32} ERROR\n",
            "HOST", "STATUS", "COMMAND"
        ));
    }
    let shown = if each {
        listed.len()
    } else {
        listed.len().min(ROLLOUT_LISTED)
    };
    for s in &listed[..shown] {
        out.push_str(&format!(
            "{:<20} {:<10} {:<32} {}\n",
            s["host"].as_str().unwrap_or("-"),
            s["status"].as_str().unwrap_or("-"),
            s["id"].as_str().unwrap_or("-"),
            s["error"]["code"].as_str().unwrap_or("")
        ));
    }
    if shown < listed.len() {
        out.push_str(&format!(
            "… and {} more that did not succeed (--each or --json lists every host)\n",
            listed.len() - shown
        ));
    }
    out.push_str(&format!("{}/{} succeeded\n", v["succeeded"], v["total"]));
    out
}

/// The rollout's one progress bar on stderr, redrawn in place: `submitted`, then
/// `done`.
fn draw(p: &rollout::Progress) {
    let filled = p.done * 20 / p.total.max(1);
    let line = format!(
        "rollout [{}{}] {}/{} submitted, {}/{} done, {} not succeeded",
        "#".repeat(filled),
        ".".repeat(20 - filled),
        p.submitted,
        p.total,
        p.done,
        p.total,
        p.failed
    );
    let mut stderr = std::io::stderr();
    let _ = write!(stderr, "\r{line}");
    let _ = stderr.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_is_not_an_intent_is_an_error() {
        let empty = expect_intent(json!({})).unwrap_err().to_string();
        assert!(empty.contains("is not an intent"), "{empty}");
        let error = json!({"error": {"code": "log_unreadable", "message": "m"}});
        let error = expect_intent(error).unwrap_err().to_string();
        assert!(
            error.contains("answered with an error") && error.contains("log_unreadable"),
            "{error}"
        );
        let intent = json!({"applied_seq": 9, "namespaces": {}, "workloads": {}});
        assert_eq!(expect_intent(intent.clone()).unwrap(), intent);
    }

    fn summary(hosts: usize, failed: usize) -> Value {
        let results: Vec<Value> = (0..hosts)
            .map(|i| {
                let (status, code) = if i < failed {
                    ("failed", json!("hook_failed"))
                } else {
                    ("succeeded", Value::Null)
                };
                json!({"host": format!("h{i:05}"), "id": format!("ro.h{i:05}"),
                    "status": status, "error": {"code": code}})
            })
            .collect();
        json!({"total": hosts, "succeeded": hosts - failed, "results": results})
    }

    /// Given a rollout to thousands of hosts, when it is summed up for a person, then
    /// the summary lists only the hosts that did not succeed, at most 20 of them,
    /// unless every host is asked for.
    #[test]
    fn a_rollout_summary_lists_the_hosts_that_did_not_succeed_not_every_host() {
        let all_ok = human_rollout(&summary(5000, 0), false);
        assert_eq!(all_ok, "5000/5000 succeeded\n");
        let some = human_rollout(&summary(5000, 3), false);
        assert_eq!(some.lines().count(), 1 + 3 + 1, "{some}");
        assert!(
            some.contains("h00002") && !some.contains("h00003"),
            "{some}"
        );
        let many = human_rollout(&summary(5000, 25), false);
        assert_eq!(many.lines().count(), 1 + ROLLOUT_LISTED + 2, "{many}");
        assert!(many.contains("… and 5 more that did not succeed"), "{many}");
        assert!(many.ends_with("4975/5000 succeeded\n"), "{many}");
        let each = human_rollout(&summary(50, 25), true);
        assert_eq!(each.lines().count(), 1 + 50 + 1, "{each}");
    }

    #[test]
    fn a_page_without_events_is_an_error_not_an_empty_log() {
        let err = expect_events(&json!({})).unwrap_err().to_string();
        assert!(err.contains("has no events"), "{err}");
        assert!(expect_events(&json!({"host": "h1", "events": []}))
            .unwrap()
            .is_empty());
    }
}
