//! The log's record decoder behind the hash check (`log::decode_record`): whatever a
//! damaged or forged record holds — unknown format versions, lengths of gigabytes —
//! a record or a defect, never a panic or an allocation crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = capstan_agent::log::decode_record(1, data);
});
