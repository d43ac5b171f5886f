//! Mappings of other processes' shared allocations, made with
//! `pidfd_open` + `pidfd_getfd` (Linux 5.6+; the kernel allows it where it
//! would allow `ptrace` attach, as for cross-memory attach) and `mmap`, and
//! kept for reuse: a training loop passes the same few buffers every step.

use super::{base_of, RegionDesc};
use std::collections::HashMap;

/// Mappings kept at most (the least recently used goes first).
const KEEP: usize = 64;

struct Mapping {
    ptr: *mut u8,
    len: usize,
    last_use: u64,
}

/// Peer allocations mapped into this process, by (pid, serial).
pub(crate) struct PeerMaps {
    pidfds: HashMap<i32, i32>,
    maps: HashMap<(i32, u64), Mapping>,
    clock: u64,
    /// Mappings kept at most.
    keep: usize,
    /// Map this process's own allocations through `pidfd_getfd` too (tests:
    /// the same path as for another process, without one).
    #[cfg(test)]
    via_pidfd_always: bool,
}

// SAFETY: the raw pointers are mappings owned by this value; the file
// descriptors are plain integers it owns.
unsafe impl Send for PeerMaps {}

fn last_os(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

impl Default for PeerMaps {
    fn default() -> PeerMaps {
        PeerMaps::with_capacity(KEEP)
    }
}

impl PeerMaps {
    /// Maps that keep at most `keep` (at least 1) mappings.
    pub(crate) fn with_capacity(keep: usize) -> PeerMaps {
        PeerMaps {
            pidfds: HashMap::new(),
            maps: HashMap::new(),
            clock: 0,
            keep: keep.max(1),
            #[cfg(test)]
            via_pidfd_always: false,
        }
    }

    /// The address in this process of `r` of process `pid` (its start, at
    /// `r.offset`), mapping the allocation if needed. `in_use` lists the
    /// mappings the caller still needs (not evicted).
    pub(crate) fn resolve(
        &mut self,
        pid: i32,
        r: &RegionDesc,
        in_use: &[(i32, u64)],
    ) -> Result<*mut u8, String> {
        self.clock += 1;
        #[cfg(test)]
        let own = pid == std::process::id() as i32 && !self.via_pidfd_always;
        #[cfg(not(test))]
        let own = pid == std::process::id() as i32;
        let base = if own {
            base_of(r.serial).ok_or_else(|| format!("allocation {} is gone", r.serial))?
        } else if let Some(m) = self.maps.get_mut(&(pid, r.serial)) {
            if m.len != r.alloc_len {
                return Err(format!("allocation {} changed size", r.serial));
            }
            m.last_use = self.clock;
            m.ptr
        } else {
            self.evict(in_use);
            let ptr = self.map(pid, r)?;
            self.maps.insert(
                (pid, r.serial),
                Mapping {
                    ptr,
                    len: r.alloc_len,
                    last_use: self.clock,
                },
            );
            ptr
        };
        Ok(base.wrapping_add(r.offset))
    }

    fn pidfd(&mut self, pid: i32) -> Result<i32, String> {
        if let Some(&fd) = self.pidfds.get(&pid) {
            return Ok(fd);
        }
        // SAFETY: plain system call with integer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(last_os(&format!("pidfd_open({pid})")));
        }
        let fd = fd as i32;
        self.pidfds.insert(pid, fd);
        Ok(fd)
    }

    fn map(&mut self, pid: i32, r: &RegionDesc) -> Result<*mut u8, String> {
        let pidfd = self.pidfd(pid)?;
        // SAFETY: plain system call; the result is a new descriptor we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, r.fd, 0) };
        if fd < 0 {
            return Err(last_os(&format!("pidfd_getfd(pid {pid}, fd {})", r.fd)));
        }
        let fd = fd as i32;
        let result = (|| {
            // SAFETY: `st` is a plain struct the kernel fills.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `fd` is open; `st` is writable.
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                return Err(last_os("fstat"));
            }
            if usize::try_from(st.st_size).ok() != Some(r.alloc_len) {
                return Err(format!(
                    "descriptor {} of pid {pid} is not allocation {} ({} bytes, expected {})",
                    r.fd, r.serial, st.st_size, r.alloc_len
                ));
            }
            // SAFETY: `fd` is open; F_GET_SEALS takes no argument.
            let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
            if seals < 0 || seals & super::FIXED_SIZE != super::FIXED_SIZE {
                return Err(format!(
                    "descriptor {} of pid {pid} (allocation {}) is not sealed at a fixed size",
                    r.fd, r.serial
                ));
            }
            // The peer's memfd (size checked and sealed above), mapped whole.
            super::map_shared(fd, r.alloc_len)
                .map(|p| p.as_ptr())
                .map_err(|e| format!("mmap: {e}"))
        })();
        // SAFETY: our descriptor; the mapping (if any) keeps the file alive.
        unsafe { libc::close(fd) };
        result
    }

    /// Makes room for one more mapping, never dropping one in `in_use`.
    fn evict(&mut self, in_use: &[(i32, u64)]) {
        while self.maps.len() >= self.keep {
            let victim = self
                .maps
                .iter()
                .filter(|(k, _)| !in_use.contains(k))
                .min_by_key(|(_, m)| m.last_use)
                .map(|(k, _)| *k);
            let Some(k) = victim else { return };
            if let Some(m) = self.maps.remove(&k) {
                // SAFETY: our mapping; no call is using it (not in `in_use`,
                // and calls resolve addresses afresh).
                unsafe { libc::munmap(m.ptr.cast(), m.len) };
            }
        }
    }
}

impl Drop for PeerMaps {
    fn drop(&mut self) {
        for m in self.maps.values() {
            // SAFETY: our mappings, unused once the owner is dropped.
            unsafe { libc::munmap(m.ptr.cast(), m.len) };
        }
        for &fd in self.pidfds.values() {
            // SAFETY: our descriptors, closed once.
            unsafe { libc::close(fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostmem::{locate, ShmBuffer};

    fn desc(b: &ShmBuffer<u32>) -> RegionDesc {
        let (serial, fd, alloc_len, offset) = locate(b.as_ptr().cast(), 4).unwrap();
        RegionDesc {
            serial,
            fd,
            alloc_len,
            offset,
            len: alloc_len,
        }
    }

    #[test]
    fn a_mapping_through_pidfd_shares_the_pages() {
        let mut maps = PeerMaps::default();
        maps.via_pidfd_always = true;
        let pid = std::process::id() as i32;
        let mut b = ShmBuffer::<u32>::zeroed(3000).unwrap();
        b[2999] = 0xC0FFEE;
        let d = desc(&b);
        let p = maps.resolve(pid, &d, &[]).unwrap();
        assert_ne!(
            p,
            b.as_ptr() as *mut u8,
            "a second mapping, not the same address"
        );
        // SAFETY: `p` maps the same 12000 bytes as `b` (checked by size in
        // `map`); this test is the only user of both.
        let view = unsafe { std::slice::from_raw_parts_mut(p.cast::<u32>(), 3000) };
        assert_eq!(view[2999], 0xC0FFEE);
        view[7] = 42;
        assert_eq!(b[7], 42, "writes through the peer mapping reach the owner");
        // Cached: the same address the second time.
        assert_eq!(maps.resolve(pid, &d, &[]).unwrap(), p);
        // A wrong size is refused, not mapped.
        let wrong = RegionDesc {
            serial: d.serial + 1_000_000,
            alloc_len: d.alloc_len + 4096,
            ..d
        };
        assert!(maps
            .resolve(pid, &wrong, &[])
            .unwrap_err()
            .contains("not allocation"));
    }

    #[test]
    fn a_freed_allocation_keeps_no_pages_in_a_peer_mapping() {
        let mut maps = PeerMaps::default();
        maps.via_pidfd_always = true;
        let pid = std::process::id() as i32;
        let mut b = ShmBuffer::<u32>::zeroed(4096).unwrap();
        b.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as u32 | 1);
        let p = maps.resolve(pid, &desc(&b), &[]).unwrap();
        // SAFETY: `p` maps the same 16 KiB as `b`, and stays mapped (in
        // `maps`) after `b` is freed; nothing else uses it.
        let view = unsafe { std::slice::from_raw_parts(p.cast::<u32>(), 4096) };
        assert_eq!(view[4095], 4095);
        drop(b);
        assert!(
            view.iter().all(|&x| x == 0),
            "the owner's free released the pages the peer mapping still covers"
        );
    }

    #[test]
    fn a_file_whose_size_is_not_sealed_is_refused() {
        let mut maps = PeerMaps::default();
        maps.via_pidfd_always = true;
        // SAFETY: a literal name; valid flags.
        let fd = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: our memfd.
        assert_eq!(unsafe { libc::ftruncate(fd, 8192) }, 0);
        let r = RegionDesc {
            serial: u64::MAX,
            fd,
            alloc_len: 8192,
            offset: 0,
            len: 8192,
        };
        let err = maps
            .resolve(std::process::id() as i32, &r, &[])
            .unwrap_err();
        assert!(err.contains("not sealed"), "{err}");
        // SAFETY: ours, closed once.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn least_recently_used_mappings_go_first_but_never_those_in_use() {
        let mut maps = PeerMaps::default();
        maps.via_pidfd_always = true;
        let pid = std::process::id() as i32;
        let bufs: Vec<ShmBuffer<u32>> = (0..KEEP + 8)
            .map(|_| ShmBuffer::zeroed(16).unwrap())
            .collect();
        let keep = (pid, desc(&bufs[0]).serial);
        for b in &bufs {
            maps.resolve(pid, &desc(b), &[keep]).unwrap();
            // Touch the first one as in use every time.
            assert!(maps.maps.contains_key(&keep));
        }
        assert_eq!(maps.maps.len(), KEEP);
        // The oldest not in use (buffers 1..=8) went; the newest stayed.
        assert!(!maps.maps.contains_key(&(pid, desc(&bufs[1]).serial)));
        assert!(maps.maps.contains_key(&(pid, desc(&bufs[KEEP + 7]).serial)));
    }
}
