//! A hook owner's reply (`HookReply::parse`: at most 64 KiB, a JSON object or
//! nothing): whatever an owner prints, a reply or a failure, never a panic.
#![no_main]

use capstan_agent::hooks::HookReply;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = HookReply::parse(data);
});
