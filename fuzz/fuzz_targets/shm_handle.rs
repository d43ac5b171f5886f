//! The shared-memory transport's connection handle decoder must return (an
//! error is fine) for any input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nccl_rs::fuzzing::shm_handle(data));
