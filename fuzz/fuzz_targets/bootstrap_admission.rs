//! `nccl_rs::fuzzing::bootstrap_admission` must keep its invariants for any
//! script of connections, bytes, closes and clock steps (stateful: drives
//! the root's admission, not only the hello decoder).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nccl_rs::fuzzing::bootstrap_admission(data);
});
