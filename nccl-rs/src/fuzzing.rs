//! Entry points for the fuzz targets (`fuzz/`): every decoder of bytes that
//! arrive from the network or from a user. Not part of the stable API.
//!
//! Each function must return normally (an error is fine) for any input;
//! a panic, hang or unbounded allocation is a bug.

/// Decodes a rank's hello as the bootstrap root does.
pub fn bootstrap_hello(data: &[u8]) {
    let _ = crate::bootstrap::fuzz_hello(data);
}

/// Drives the bootstrap root's admission (connections, bytes, closes,
/// clock steps, rank 0's job size) with `data` read as a script, checking
/// its invariants: no connection answered twice, no job admitted at a size
/// other than rank 0's, bounded state for any number of strangers.
pub fn bootstrap_admission(data: &[u8]) {
    crate::bootstrap::fuzz_admission(data);
}

/// Splits a byte stream into bootstrap frames and decodes each as the root
/// and the ranks do (kinds, gather replies, sequence frames).
pub fn bootstrap_frames(data: &[u8]) {
    crate::bootstrap::fuzz_frames(data);
}

/// Parses a 128-byte unique id (and its hex form).
pub fn unique_id(data: &[u8]) {
    let _ = crate::bootstrap::UniqueId::from_bytes(data);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = crate::bootstrap::UniqueId::from_hex(s);
    }
}

/// Parses configuration values as `Config::from_lookup` does, with every
/// variable set to the input.
pub fn config_values(data: &[u8]) {
    let v = String::from_utf8_lossy(data).into_owned();
    let _ = crate::config::Config::from_lookup(|_| Some(v.clone()));
    let _ = crate::launch::LaunchEnv::from_lookup(|_| Some(v.clone()));
}

/// Decodes a shared-memory transport handle.
pub fn shm_handle(data: &[u8]) {
    crate::transport::shm::fuzz_handle(data);
}
