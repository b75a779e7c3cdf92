//! Fuzz target: a runner's artifact (the JSON before its trailer) that was tampered with is
//! refused, not trusted: it fails to parse, or its plan fails `Plan::verify` (which a backend
//! runs before making code from it), or it is a plan that verifies. Never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = runtime::artifact::parse_artifact(data) {
        let _ = a.payload.plan().verify();
    }
});
