//! What a revision is on the host, computed without I/O: its names, its files, the
//! blocks fw_cfg hands the guest, and QEMU's command line.
//!
//! ```text
//! <state_dir>/<ns>/namespace.json           the namespace (its host)
//! <state_dir>/<ns>/<workload>/<rev>/        identity.json (with the spec), env, argv,
//!                                           disk.qcow2, console.log, exit-status
//! <run_dir>/<12 hex of the VM's name>/      qemu.pid, qmp.sock (exit watch), qmp-ops.sock
//! ```
//!
//! The run directory is short on purpose: a UNIX socket's path must fit in 108 bytes.

use crate::spec::VmSpec;
use capstan_driver::RevisionRef;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The fw_cfg names the guest reads (`/sys/firmware/qemu_fw_cfg/by_name/<name>/raw`).
pub const FW_CFG_ENV: &str = "opt/capstan/env";
pub const FW_CFG_ARGV: &str = "opt/capstan/argv";

/// What QEMU calls its process threads (`/proc/PID/comm`): every VM of capstan's.
pub const PROCESS_NAME: &str = "capstan-vm";

/// QEMU's `-name` option for the VM named `name`: what its command line carries and
/// what [`crate::process`] looks for there.
pub fn name_option(name: &str) -> String {
    format!("guest={},process={PROCESS_NAME}", name.replace(',', ",,"))
}

/// One revision's VM on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vm {
    /// `<host>/<ns>/<workload>@<rev>`: QEMU's `-name guest=`, what `query-name`
    /// answers and what `/proc/PID/cmdline` is checked for before the driver touches a
    /// process (never a pid alone).
    pub name: String,
    /// The revision's files.
    pub state: PathBuf,
    /// Its pidfile and sockets.
    pub run: PathBuf,
}

impl Vm {
    pub fn new(host: &str, rev: RevisionRef<'_>, state_dir: &Path, run_dir: &Path) -> Vm {
        let name = format!("{host}/{}/{}@{}", rev.namespace, rev.workload, rev.revision);
        Vm {
            state: state_dir
                .join(rev.namespace)
                .join(rev.workload)
                .join(rev.revision),
            run: run_dir.join(capstan_driver::short_hash(name.as_bytes())),
            name,
        }
    }

    pub fn identity(&self) -> PathBuf {
        self.state.join("identity.json")
    }
    pub fn env(&self) -> PathBuf {
        self.state.join("env")
    }
    pub fn argv(&self) -> PathBuf {
        self.state.join("argv")
    }
    pub fn disk(&self) -> PathBuf {
        self.state.join("disk.qcow2")
    }
    pub fn console(&self) -> PathBuf {
        self.state.join("console.log")
    }
    /// Where the guest's init writes `{"exit_code":N}` (its second serial port).
    pub fn exit_record(&self) -> PathBuf {
        self.state.join("exit-status")
    }
    pub fn pidfile(&self) -> PathBuf {
        self.run.join("qemu.pid")
    }
    /// The monitor an exit watch holds (its events).
    pub fn events_socket(&self) -> PathBuf {
        self.run.join("qmp.sock")
    }
    /// The monitor for commands (and for people: `socat - UNIX:…`).
    pub fn ops_socket(&self) -> PathBuf {
        self.run.join("qmp-ops.sock")
    }

    /// `-uuid`: stable for the revision, what the guest reads as its DMI product UUID.
    pub fn uuid(&self) -> String {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(format!("uuid:{}", self.name).as_bytes());
        let hex = capstan_common::signing::to_hex(&digest[..16]);
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

/// The launch environment as fw_cfg hands it to the guest: `KEY=VALUE\0` records,
/// sorted by name (the `/proc/PID/environ` format; a name never holds `=` and no value
/// holds NUL, `capstan_common::validate`).
pub fn env_block(env: &BTreeMap<String, String>) -> Vec<u8> {
    let mut block = Vec::new();
    for (k, v) in env {
        block.extend_from_slice(k.as_bytes());
        block.push(b'=');
        block.extend_from_slice(v.as_bytes());
        block.push(0);
    }
    block
}

/// The spec's `command` as fw_cfg hands it to the guest: `ITEM\0` each; empty when
/// the spec gives none (the guest then runs its own default).
pub fn argv_block(command: &[String]) -> Vec<u8> {
    let mut block = Vec::new();
    for item in command {
        block.extend_from_slice(item.as_bytes());
        block.push(0);
    }
    block
}

/// `systemd-run`'s arguments (before QEMU's program and arguments) that start `vm`'s
/// QEMU in a transient scope of its own, `capstan-vm-<12 hex of its name>-<serial>`,
/// removed once QEMU is gone.
pub fn scope_args(vm: &Vm, serial: u128) -> Vec<String> {
    let hex = vm
        .run
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    vec![
        "--scope".into(),
        "--collect".into(),
        "--quiet".into(),
        format!("--unit=capstan-vm-{hex}-{serial}"),
        format!("--description=capstan VM {}", vm.name),
    ]
}

/// A value inside one of QEMU's `key=value,…` options: a `,` is written `,,`.
fn opt(path: &Path) -> String {
    path.to_string_lossy().replace(',', ",,")
}

/// A loopback port of the host QEMU forwards to a port of the guest (user network):
/// where the driver probes an `http` readiness check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forward {
    pub host: u16,
    pub guest: u16,
}

impl Forward {
    /// The `hostfwd=` rule of QEMU's user network.
    fn rule(self) -> String {
        format!("hostfwd=tcp:127.0.0.1:{}-:{}", self.host, self.guest)
    }

    /// The forward on a running QEMU's command line (`/proc/PID/cmdline`), if any.
    pub fn of_cmdline(cmdline: &[u8]) -> Option<Forward> {
        cmdline
            .split(|b| *b == 0)
            .filter_map(|a| std::str::from_utf8(a).ok())
            .filter(|a| a.starts_with("user,id=net0,"))
            .flat_map(|a| a.split(','))
            .find_map(|opt| {
                let (host, guest) = opt
                    .strip_prefix("hostfwd=tcp:127.0.0.1:")?
                    .split_once("-:")?;
                Some(Forward {
                    host: host.parse().ok()?,
                    guest: guest.parse().ok()?,
                })
            })
    }
}

/// QEMU's arguments for `vm` (after the program): daemonized, with its pidfile (whose
/// lock makes a second QEMU of the same revision exit before it binds anything), two
/// monitors, the console and the exit record as files, no reboot (a guest that
/// reboots or panics ends), and the launch environment through fw_cfg only — never
/// on the command line, which `ps` shows.
pub fn qemu_args(
    vm: &Vm,
    settings: &VmSpec,
    images_dir: &Path,
    forward: Option<Forward>,
) -> Vec<OsString> {
    let mut args: Vec<String> = vec![
        "-accel".into(),
        settings.accel.as_str().into(),
        "-machine".into(),
        "q35".into(),
        "-m".into(),
        settings.memory_mib.to_string(),
        "-smp".into(),
        settings.vcpus.to_string(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-name".into(),
        name_option(&vm.name),
        "-uuid".into(),
        vm.uuid(),
        "-daemonize".into(),
        "-pidfile".into(),
        vm.pidfile().to_string_lossy().into_owned(),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", opt(&vm.events_socket())),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", opt(&vm.ops_socket())),
        "-chardev".into(),
        format!("file,id=console,path={}", opt(&vm.console())),
        "-serial".into(),
        "chardev:console".into(),
        "-chardev".into(),
        format!("file,id=exit,path={}", opt(&vm.exit_record())),
        "-serial".into(),
        "chardev:exit".into(),
        "-fw_cfg".into(),
        format!("name={FW_CFG_ENV},file={}", opt(&vm.env())),
        "-fw_cfg".into(),
        format!("name={FW_CFG_ARGV},file={}", opt(&vm.argv())),
    ];
    if let Some(kernel) = &settings.kernel {
        args.extend(["-kernel".into(), opt(&images_dir.join(kernel))]);
        if let Some(initrd) = &settings.initrd {
            args.extend(["-initrd".into(), opt(&images_dir.join(initrd))]);
        }
        let mut append = "console=ttyS0 panic=-1".to_string();
        if let Some(more) = &settings.append {
            append.push(' ');
            append.push_str(more);
        }
        args.extend(["-append".into(), append]);
    }
    if settings.disk.is_some() {
        args.extend([
            "-drive".into(),
            format!("file={},if=virtio,format=qcow2", opt(&vm.disk())),
        ]);
    }
    match settings.network {
        crate::spec::Network::None => {}
        crate::spec::Network::User => args.extend([
            "-netdev".into(),
            match forward {
                Some(f) => format!("user,id=net0,{}", f.rule()),
                None => "user,id=net0".into(),
            },
            "-device".into(),
            "virtio-net-pci,netdev=net0".into(),
        ]),
    }
    args.into_iter().map(OsString::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Accel, Network};

    fn rev() -> RevisionRef<'static> {
        RevisionRef {
            namespace: "ns",
            workload: "web",
            revision: "r1",
        }
    }

    fn vm() -> Vm {
        Vm::new(
            "h1",
            rev(),
            Path::new("/var/lib/capstan/vm"),
            Path::new("/run/v"),
        )
    }

    /// Given an env with awkward values, when made into the fw_cfg block, then it is
    /// each name=value in name order, NUL-terminated, bytes unchanged.
    #[test]
    fn the_env_block_is_sorted_nul_terminated_records_byte_for_byte() {
        let env: BTreeMap<String, String> = [
            ("PCT", "100% $HOME `x` \"q\" 'q'"),
            ("NL", "a\nb\r\n"),
            ("UTF8", "héllo 日本 🚀"),
            ("EMPTY", ""),
            ("EQ", "a=b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let block = env_block(&env);
        let expected =
            "EMPTY=\0EQ=a=b\0NL=a\nb\r\n\0PCT=100% $HOME `x` \"q\" 'q'\0UTF8=héllo 日本 🚀\0";
        assert_eq!(block, expected.as_bytes());
        assert_eq!(
            argv_block(&["/bin/app".into(), "a b".into()]),
            b"/bin/app\0a b\0"
        );
        assert!(argv_block(&[]).is_empty());
    }

    /// Given a revision and its settings, when QEMU's command line is made, then it
    /// names the revision, the chosen accelerator and the env file — and no env value.
    #[test]
    fn the_command_line_names_the_revision_and_carries_no_value() {
        let settings = VmSpec {
            kernel: Some("vmlinuz".into()),
            initrd: Some("initrd.gz".into()),
            append: Some("quiet".into()),
            accel: Accel::Tcg,
            network: Network::User,
            ..VmSpec::default()
        };
        let forward = Forward {
            host: 40001,
            guest: 8080,
        };
        let args: Vec<String> = qemu_args(&vm(), &settings, Path::new("/img"), Some(forward))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let after = |flag: &str| {
            let i = args.iter().position(|a| a == flag).unwrap();
            args[i + 1].clone()
        };
        assert_eq!(after("-accel"), "tcg");
        assert_eq!(after("-name"), "guest=h1/ns/web@r1,process=capstan-vm");
        assert_eq!(after("-kernel"), "/img/vmlinuz");
        assert_eq!(after("-initrd"), "/img/initrd.gz");
        assert_eq!(after("-append"), "console=ttyS0 panic=-1 quiet");
        assert!(args
            .contains(&"name=opt/capstan/env,file=/var/lib/capstan/vm/ns/web/r1/env".to_string()));
        assert!(args.contains(&"-daemonize".to_string()));
        assert!(!args.iter().any(|a| a.contains("-drive")));
        assert_eq!(
            after("-netdev"),
            "user,id=net0,hostfwd=tcp:127.0.0.1:40001-:8080"
        );
        let cmdline: Vec<u8> = args.iter().flat_map(|a| a.bytes().chain([0])).collect();
        assert_eq!(Forward::of_cmdline(&cmdline), Some(forward));
        assert_eq!(Forward::of_cmdline(b"qemu\0-netdev\0user,id=net0\0"), None);
        assert_eq!(vm().uuid().len(), 36);
        let scope = scope_args(&vm(), 7);
        assert!(
            scope.contains(&format!(
                "--unit=capstan-vm-{}-7",
                capstan_driver::short_hash(b"h1/ns/web@r1")
            )),
            "{scope:?}"
        );
        assert_ne!(
            vm().uuid(),
            Vm::new("h2", rev(), Path::new("/s"), Path::new("/r")).uuid()
        );
    }

    /// Given state and run directories with a comma, when written into QEMU's options,
    /// then the comma is doubled (QEMU's escape), so no path adds an option.
    #[test]
    fn a_comma_in_a_path_cannot_add_an_option() {
        let vm = Vm::new("h1", rev(), Path::new("/s,x=1"), Path::new("/r,y"));
        let args: Vec<String> = qemu_args(
            &vm,
            &VmSpec {
                kernel: Some("k".into()),
                ..VmSpec::default()
            },
            Path::new("/i"),
            None,
        )
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
        assert!(args.contains(&"name=opt/capstan/env,file=/s,,x=1/ns/web/r1/env".to_string()));
        assert!(args.iter().any(|a| a.starts_with("unix:/r,,y/")));
    }

    #[test]
    fn the_run_dir_is_short_enough_for_a_socket() {
        let long = "a".repeat(63);
        let rev = RevisionRef {
            namespace: &long,
            workload: &long,
            revision: &long,
        };
        let vm = Vm::new(
            &long,
            rev,
            Path::new("/var/lib/capstan/vm"),
            Path::new("/var/lib/capstan/vm-run"),
        );
        assert!(
            vm.ops_socket().as_os_str().len() < 108,
            "{}",
            vm.ops_socket().display()
        );
    }
}
