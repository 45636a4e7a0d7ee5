//! The signals that stop `apply`, `run` and `sim-fleet`, and what each means.

/// The signal that stopped the agent.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stop {
    Term,
    Int,
    /// `run`: stop leaving the workloads running (the package's upgrade sends it).
    Usr2,
}

impl Stop {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stop::Term => "SIGTERM",
            Stop::Int => "SIGINT",
            Stop::Usr2 => "SIGUSR2",
        }
    }

    /// `apply`'s exit code after a stop: 128 + the signal's number, as a shell reports
    /// a process the signal ended (143, 130), but reached by a clean exit.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Stop::Term => 143,
            Stop::Int => 130,
            Stop::Usr2 => 140,
        }
    }
}

/// Installs the SIGTERM/SIGINT/SIGUSR2 handlers now (so a signal sent as soon as the
/// agent says it is ready is never lost to the default action) and returns the wait.
/// The first signal decides: a SIGTERM that follows a SIGUSR2 (`systemctl stop` after
/// the package's upgrade asked for a leave-running stop) changes nothing.
pub(crate) fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = Stop>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    Ok(async move {
        let stop = tokio::select! {
            biased;
            _ = usr2.recv() => Stop::Usr2,
            _ = term.recv() => Stop::Term,
            _ = int.recv() => Stop::Int,
        };
        tracing::info!("{}: stopping", stop.name());
        stop
    })
}
