//! An operator's sandbox policy (`--policy`): parsed, or refused in one
//! clear line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratchet_fuzz::assert_one_clear_line;
use ratchet_runtime::plugin::Policy;

fuzz_target!(|text: &str| {
    if let Err(e) = Policy::parse("policy.toml", text) {
        assert_one_clear_line("policy", &e.to_string());
    }
});
