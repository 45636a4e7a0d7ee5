//! The built-in drivers' own rules for a spec, checked when a command is submitted (a
//! refusal is 400 `invalid_spec`, before anything is published). Each driver crate
//! owns its rules and its section (`capstan_systemd::spec`, `capstan_kube::spec`,
//! `capstan_docker::check_spec`, `capstan_vm::spec`, `capstan_driver::sim::check_spec`); the coordinator
//! links them without the drivers themselves (their `driver` feature off). A spec for
//! any other kind is an external driver's: its rules are the driver's own, and the
//! agent that runs it checks them (`Driver::check_spec`).

use capstan_common::{DriverKind, Rejection, Settings as _, Spec};

/// Refuses `spec` by the rules of its built-in driver (a spec of any other kind
/// passes), and writes that driver's section in its canonical form: the settings'
/// field order, every field spelt out, none at their defaults. Those are the bytes any
/// build of capstan signs for those settings, so an agent of an older build, which
/// reads the section as typed settings and writes it back so, verifies the signature.
pub fn admit(spec: &mut Spec) -> Result<(), Rejection> {
    match spec.driver {
        DriverKind::SIM => capstan_driver::sim::check_spec(spec),
        DriverKind::DOCKER => capstan_docker::check_spec(spec),
        DriverKind::SYSTEMD => {
            capstan_systemd::spec::check(spec)?.write_into(spec);
            Ok(())
        }
        DriverKind::KUBE => {
            capstan_kube::spec::check(spec)?.write_into(spec);
            Ok(())
        }
        DriverKind::VM => {
            capstan_vm::spec::check(spec)?.write_into(spec);
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_common::ErrorCode;

    fn spec(json: &str) -> Spec {
        serde_json::from_str(json).unwrap()
    }

    fn check(spec: &Spec) -> Result<Spec, Rejection> {
        let mut spec = spec.clone();
        admit(&mut spec).map(|()| spec)
    }

    fn refused(json: &str) -> String {
        let e = check(&spec(json)).expect_err(json);
        assert_eq!(e.code, ErrorCode::InvalidSpec, "{e:?}");
        e.message
    }

    /// Given hostile VM specs (a kernel outside the images dir, a comma adding a QEMU
    /// option, a kernel command line smuggling a quote or a line, a field the section
    /// does not have, sizes out of range), when submitted, then each is refused
    /// `invalid_spec` before anything is published (`tests/tests/e2e/vm/hostile.rs`
    /// sends the same to an agent).
    #[test]
    fn hostile_vm_specs_are_refused_at_submission() {
        for (vm, says) in [
            (r#"{"kernel":"../../../etc/shadow"}"#, "images_dir"),
            (r#"{"kernel":"/boot/vmlinuz"}"#, "images_dir"),
            (r#"{"kernel":"k","initrd":"i,if=none"}"#, "images_dir"),
            (r#"{"disk":"base.qcow2,file.driver=ssh"}"#, "images_dir"),
            (
                r#"{"kernel":"k","append":"quiet\" init=/bin/sh"}"#,
                "vm.append",
            ),
            (
                r#"{"kernel":"k","append":"quiet\ninit=/bin/sh"}"#,
                "vm.append",
            ),
            (
                r#"{"kernel":"k","fw_cfg":{"name":"opt/capstan/env"}}"#,
                "unknown field",
            ),
            (r#"{"kernel":"k","memory_mib":1073741824}"#, "memory_mib"),
            (r#"{"kernel":"k","vcpus":1000}"#, "vcpus"),
            (r#"{"kernel":"k","accel":"kvm,foo=bar"}"#, "unknown variant"),
        ] {
            let message = refused(&format!(r#"{{"driver":"vm","vm":{vm}}}"#));
            assert!(message.contains(says), "{vm}: {message}");
        }
    }

    /// Given specs each breaking one built-in driver's own rule, when submitted, then
    /// each is refused with that driver's message; a spec of a kind no build knows
    /// passes (its agent's driver checks it).
    #[test]
    fn each_built_in_drivers_rules_are_its_own() {
        check(&spec(r#"{"driver":"sim"}"#)).unwrap();
        assert!(refused(r#"{"driver":"sim","sim":{"x":1}}"#).contains("leave `sim` out"));
        assert_eq!(
            refused(r#"{"driver":"docker"}"#),
            "driver docker needs `image`"
        );
        assert!(refused(r#"{"driver":"systemd","command":["app"]}"#).contains("absolute path"));
        assert!(refused(
            r#"{"driver":"systemd","command":["/bin/app"],"systemd":{"capabilities":["CAP_SYS_ADMIN"]}}"#
        )
        .contains("systemd.capabilities"));
        assert!(
            refused(r#"{"driver":"systemd","command":["/bin/app"],"systemd":{"usr":"x"}}"#)
                .starts_with("`systemd`: unknown field `usr`")
        );
        assert_eq!(
            refused(r#"{"driver":"kube","image":"web:1","kube":{"replicas":0}}"#),
            "kube.replicas must be 1 to 1000"
        );
        check(&spec(
            r#"{"driver":"kube","image":"web:1","kube":{"replicas":3}}"#,
        ))
        .unwrap();
        check(&spec(r#"{"driver":"vm","vm":{"kernel":"vmlinuz"}}"#)).unwrap();
        check(&spec(r#"{"driver":"acme","acme":{"anything":[1,2]}}"#)).unwrap();
    }

    /// Given built-in sections as a client may write them (any order, fields left
    /// out, at their defaults), when admitted, then each is written as the typed
    /// settings write it, which is what a build before sections were data signed; an
    /// external driver's section is left as written.
    #[test]
    fn a_built_in_section_is_written_in_its_canonical_form() {
        let canonical = |json: &str| {
            let spec = check(&spec(json)).unwrap();
            let text = serde_json::to_string(&spec).unwrap();
            text[text.find(r#""ports":[]"#).unwrap() + 10..].to_string()
        };
        assert_eq!(
            canonical(
                r#"{"driver":"systemd","command":["/bin/app"],"systemd":{"cpu_quota_percent":150,"user":"app"}}"#
            ),
            r#","systemd":{"user":"app","group":null,"read_write_paths":[],"memory_max_bytes":null,"cpu_quota_percent":150}}"#
        );
        assert_eq!(
            canonical(r#"{"driver":"systemd","command":["/bin/app"],"systemd":{"user":null}}"#),
            "}"
        );
        assert_eq!(
            canonical(r#"{"driver":"kube","image":"w:1","kube":{"replicas":1}}"#),
            "}"
        );
        assert_eq!(
            canonical(r#"{"driver":"kube","image":"w:1","kube":{"replicas":2}}"#),
            r#","kube":{"replicas":2}}"#
        );
        assert_eq!(
            canonical(r#"{"driver":"acme","acme":{"z":1,"a":{}}}"#),
            r#","acme":{"z":1,"a":{}}}"#
        );
    }
}
