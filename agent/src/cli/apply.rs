//! `capstan-agent apply FILE`: commands from a file or stdin, one JSON line each,
//! carried out in order without NATS; each result a JSON line on stdout.

use crate::context::{start, Context};
use crate::signal::stop_signal;
use anyhow::Context as _;
use capstan_common::Outcome;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;

pub(crate) async fn apply(ctx: &Context, file: &Path) -> anyhow::Result<ExitCode> {
    // First, so that a signal during startup is handled after it, not fatal.
    let stopped = stop_signal()?;
    let executor = start(ctx).await?;
    let input: Box<dyn BufRead + Send> = if file == Path::new("-") {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?,
        ))
    };
    let mut lines = read_lines(input);
    let degraded = executor.log().degraded().cloned();
    let mut out = std::io::stdout().lock();
    let mut all_ok = true;
    tokio::pin!(stopped);
    let mut signal = None;
    // The input's line number, blank lines counted: what a JSON error names.
    let mut number = 0;
    loop {
        let line = tokio::select! {
            line = lines.recv() => line,
            s = &mut stopped => {
                signal = Some(s);
                break;
            }
        };
        let Some(line) = line else { break };
        let text = line.context("cannot read input")?;
        number += 1;
        if text.trim().is_empty() {
            continue;
        }
        // A degraded log answers every line `rejected`/`log_degraded` and writes nothing.
        let submit = executor.submit_at(&text, number);
        tokio::pin!(submit);
        let result = tokio::select! {
            r = &mut submit => r,
            s = &mut stopped => {
                // Cut the command's hooks short; it compensates under the fresh
                // cleanup budget and completes `cancelled`.
                signal = Some(s);
                executor.shutdown_token().cancel();
                submit.await
            }
        };
        all_ok &= result.outcome == Outcome::Succeeded;
        serde_json::to_writer(&mut out, &result)?;
        out.write_all(b"\n")?;
        out.flush()?;
        if signal.is_some() {
            break;
        }
    }
    executor.log().flush()?;
    Ok(if let Some(signal) = signal {
        tracing::info!(
            "stopped by {}; the rest of the input was not read",
            signal.name()
        );
        ExitCode::from(signal.exit_code())
    } else if degraded.is_some() {
        ExitCode::from(3)
    } else if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Reads `input` line by line on its own thread (a blocking read must not hold up a
/// signal), so that `apply` can stop between lines.
fn read_lines(
    input: Box<dyn BufRead + Send>,
) -> tokio::sync::mpsc::Receiver<std::io::Result<String>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    std::thread::spawn(move || {
        for line in input.split(b'\n') {
            let line = line.map(|l| String::from_utf8_lossy(&l).into_owned());
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    rx
}
