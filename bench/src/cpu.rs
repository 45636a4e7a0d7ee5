//! CPU a process used: utime + stime from `/proc/<pid>/stat`, and a meter over
//! several processes between two points of a benchmark.

/// utime + stime of `pid`, in clock ticks (fields 14 and 15 of `/proc/<pid>/stat`,
/// counted after the command name, which may hold spaces).
pub fn ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("no command name in /proc/{pid}/stat"))?;
    // After the name: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> { Ok(fields[n - 3].parse()?) };
    Ok(field(14)? + field(15)?)
}

/// Clock ticks a second (`getconf CLK_TCK`).
pub fn ticks_per_second() -> anyhow::Result<f64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// The CPU of named processes from [`Meter::start`] to [`Meter::per`].
pub struct Meter {
    processes: Vec<(&'static str, u32, u64)>,
}

impl Meter {
    pub fn start(processes: &[(&'static str, u32)]) -> anyhow::Result<Meter> {
        let processes = processes
            .iter()
            .map(|&(name, pid)| Ok((name, pid, ticks(pid)?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Meter { processes })
    }

    /// Milliseconds of CPU each process used since the start, per one of `items`:
    /// `{name: ms}`.
    pub fn per(&self, items: usize) -> anyhow::Result<serde_json::Value> {
        let per_s = ticks_per_second()?;
        let mut used = serde_json::Map::new();
        for &(name, pid, start) in &self.processes {
            let ms = (ticks(pid)? - start) as f64 / per_s * 1000.0 / items as f64;
            used.insert(name.into(), ((ms * 1000.0).round() / 1000.0).into());
        }
        Ok(used.into())
    }
}
