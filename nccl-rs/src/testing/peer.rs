//! A peer in another process for the cross-process tests: the test binary
//! re-runs itself, running only the test that plays the peer (`child_peer`
//! in each user), which finds its mode in [`CHILD_ENV`] and a directory
//! shared with the parent in [`DIR_ENV`]; the two exchange transport
//! handles as files there.

use super::shm::poll;
use crate::transport::{Net, RecvComm, SendComm};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// The peer's mode, set only in the peer process.
pub const CHILD_ENV: &str = "NCCL_RS_SHM_TEST_CHILD";
/// The directory the parent and the peer share.
pub const DIR_ENV: &str = "NCCL_RS_SHM_TEST_DIR";

/// A new, empty directory of this process's own.
pub fn test_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "nccl-rs-shm-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes `handle` to `path` whole (through a rename), for [`read_handle`].
pub fn write_handle(path: &Path, handle: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, handle).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Waits for the file `path` and returns its contents; with `child`,
/// fails if that process exits meanwhile.
pub fn read_handle(path: &Path, child: Option<&mut Child>) -> Vec<u8> {
    let mut child = child;
    poll("handle file", || {
        if let Some(c) = child.as_deref_mut() {
            assert!(c.try_wait().unwrap().is_none(), "peer process exited early");
        }
        Ok(std::fs::read(path).ok())
    })
    .unwrap()
}

/// Re-runs this test binary as the peer: only the test `test` (its full
/// path in the binary), in `mode`, sharing `dir`.
pub fn spawn_child(test: &str, mode: &str, dir: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env(DIR_ENV, dir)
        .spawn()
        .unwrap()
}

/// Kills and reaps `child` when dropped (a failed assertion must not leave
/// a peer spinning).
pub struct Reap(pub Option<Child>);

impl Reap {
    /// Waits for the peer to exit and checks that it succeeded.
    ///
    /// # Panics
    /// If the peer was already reaped, or failed.
    pub fn wait_success(&mut self) {
        let status = self.0.take().unwrap().wait().unwrap();
        assert!(status.success(), "peer failed: {status}");
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Listens on `net`, starts the peer process (the test `test`) in `mode`
/// and accepts its connection: the test's directory, the peer and the
/// receiving comm. The peer connects with [`connect_to_parent`].
pub fn start_peer(net: &dyn Net, test: &str, mode: &str) -> (PathBuf, Reap, Box<dyn RecvComm>) {
    let dir = test_dir();
    let mut l = net.listen().unwrap();
    write_handle(&dir.join("parent.handle"), l.handle());
    let mut child = Reap(Some(spawn_child(test, mode, &dir)));
    let r = poll("accept", || {
        assert!(
            child.0.as_mut().unwrap().try_wait().unwrap().is_none(),
            "peer exited early"
        );
        l.accept()
    })
    .unwrap();
    (dir, child, r)
}

/// In the peer process, its mode and the shared directory; `None` in any
/// other process (where the peer's test is a no-op).
pub fn child_mode() -> Option<(String, PathBuf)> {
    let mode = std::env::var(CHILD_ENV).ok()?;
    let dir = PathBuf::from(std::env::var(DIR_ENV).unwrap());
    Some((mode, dir))
}

/// In the peer process, connects over `net` to the parent listening in
/// [`start_peer`].
pub fn connect_to_parent(net: &dyn Net, dir: &Path) -> Box<dyn SendComm> {
    let h = read_handle(&dir.join("parent.handle"), None);
    let mut c = net.connect(&h).unwrap();
    poll("connect", || c.poll_connect()).unwrap()
}
