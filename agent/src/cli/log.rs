//! `capstan-agent log`: the records, `log verify`, `log layout` and `log export`, from
//! the running agent over its local socket when one runs, else from the log files.

use crate::context::{open_log, Context};
use crate::{log_export, log_files, LogAction, LogArgs};
use capstan_agent::local_socket;
use capstan_agent::log::LogError;
use capstan_common::answers::{LogRequest, Verb, VerifyAnswer};
use capstan_common::audit_table;
use std::io::Write;
use std::process::ExitCode;

/// `capstan-agent log`: from the running agent over its local socket when one runs
/// (it holds the log), else from the log files.
pub(crate) fn show_log(ctx: &Context, args: &LogArgs) -> anyhow::Result<ExitCode> {
    let running = local_socket::running(&ctx.data_dir);
    let source = || -> anyhow::Result<log_export::Source> {
        Ok(match &running {
            Some(path) => log_export::Source::Agent(path.clone()),
            None => log_export::Source::Files(open_log(ctx)?),
        })
    };
    match &args.action {
        Some(LogAction::Export {
            since,
            until,
            output,
        }) => return log_export::run(&source()?, *since, *until, output.as_deref()),
        Some(LogAction::Verify { export }) if !export.is_empty() => {
            return log_export::verify(&source()?, export)
        }
        Some(LogAction::Layout) => return log_files::layout(&ctx.data_dir, running.as_deref()),
        _ => {}
    }
    if let Some(LogAction::Verify { .. }) = args.action {
        let verdict = match &running {
            Some(path) => match local_socket::ask_as(path, Verb::Verify, &())? {
                VerifyAnswer::Verified { verified, anchor } => Ok((verified, anchor)),
                VerifyAnswer::Bad { bad } => Err((bad.seq, bad.defect)),
            },
            None => match open_log(ctx).and_then(|log| {
                let anchor = log.anchor()?.map(|a| a.summary());
                Ok(log.verify().map(|n| (n, anchor)))
            })? {
                Ok(n) => Ok(n),
                Err(LogError::Corrupt(c)) => Err((c.seq, c.defect.to_string())),
                Err(e) => return Err(e.into()),
            },
        };
        return Ok(match verdict {
            Ok((n, anchor)) => {
                writeln!(
                    std::io::stdout(),
                    "ok {n} records{}",
                    log_export::anchor_words(anchor.as_ref())
                )?;
                ExitCode::SUCCESS
            }
            Err((seq, defect)) => {
                writeln!(std::io::stdout(), "bad record {seq}: {defect}")?;
                ExitCode::from(1)
            }
        });
    }
    let request = LogRequest {
        since: args.since,
        limit: None,
        command: args.command.clone(),
        namespace: args.namespace.clone(),
        workload: args.workload.clone(),
        since_time: args.since_time,
        until_time: args.until_time,
    };
    let (records, bad) = match &running {
        Some(path) => (local_socket::log_records(path, &request)?, 0),
        None => log_files::read_log(&ctx.data_dir.join("log"), &request)?,
    };
    let mut out = std::io::stdout().lock();
    if !args.json {
        writeln!(out, "{}", audit_table::header())?;
    }
    for json in &records {
        if args.json {
            serde_json::to_writer(&mut out, json)?;
            writeln!(out)?;
        } else {
            writeln!(out, "{}", audit_table::row(json))?;
        }
    }
    Ok(if bad > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
