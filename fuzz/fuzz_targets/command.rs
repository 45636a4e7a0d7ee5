//! A command line as the agent and the coordinator take it (`Command::parse`: JSON,
//! then every rule of docs/protocol.md). Whatever the bytes: no panic; a command
//! accepted has a canonical JSON (`Command::to_json`, what is signed) that parses to
//! the same command, with the same content (what its id is bound to).
#![no_main]

use capstan_common::Command;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(command) = Command::parse(text) {
        let canonical = command.to_json();
        let again = match Command::parse(&canonical) {
            Ok(again) => again,
            Err(e) => panic!("its canonical JSON does not parse ({e:?}): {canonical}"),
        };
        assert_eq!(again.to_json(), canonical);
        assert_eq!(again.content(), command.content());
    }
});
