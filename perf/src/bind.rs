//! CPU binding of `ncclrun`'s ranks, as `mpirun --bind-to core` does.
//!
//! Each rank is bound to one of the CPUs `ncclrun` may run on: rank `r` of
//! `n` gets CPU `cpus[r * cpus.len() / n]`, i.e. one CPU each while there
//! are enough, and otherwise neighbouring ranks share a CPU (blocks of
//! `n / cpus.len()`). Left unbound, the scheduler moves ranks between CPUs
//! and sometimes stacks two busy ones on one CPU while the other idles, so
//! unbound latencies vary from run to run (bound, small and middle-sized
//! collectives ran up to twice as fast). Blocks of neighbouring ranks beat
//! round-robin when ranks share CPUs, since neighbours in the ring then
//! hand data over within one CPU. `mpirun` binds 2 ranks to cores by default likewise (and
//! leaves oversubscribed ranks unbound). `ncclrun --bind none` leaves them
//! to the scheduler (say, for several jobs sharing the machine).

/// How `ncclrun` binds its ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// One CPU per rank, or per block of neighbouring ranks (the default).
    Core,
    /// No binding: the ranks inherit `ncclrun`'s CPUs.
    None,
}

impl Bind {
    /// Parses `--bind`'s value.
    pub fn parse(s: &str) -> Result<Bind, String> {
        match s {
            "core" => Ok(Bind::Core),
            "none" => Ok(Bind::None),
            _ => Err(format!("bad --bind '{s}' (core or none)")),
        }
    }
}

/// The CPU that rank `rank` of `n` is bound to, from `cpus` (the CPUs
/// allowed, in order); `None` with no binding or no CPU list.
pub fn cpu_for(bind: Bind, rank: usize, n: usize, cpus: &[usize]) -> Option<usize> {
    if bind == Bind::None || cpus.is_empty() || n == 0 || rank >= n {
        return None;
    }
    Some(cpus[rank * cpus.len() / n])
}

/// The CPUs this process may run on, in increasing order (empty if the
/// kernel will not say).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is a plain bit array, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, inside the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// A CPU set holding only `cpu`, for `sched_setaffinity` in the child.
pub fn single_cpu_set(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: `cpu_set_t` is a plain bit array, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu < libc::CPU_SETSIZE as usize {
        // SAFETY: `cpu` is below CPU_SETSIZE, inside the set.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cpu_each_then_blocks() {
        let cpus = [0, 1];
        let at = |n: usize| -> Vec<_> {
            (0..n)
                .map(|r| cpu_for(Bind::Core, r, n, &cpus).unwrap())
                .collect()
        };
        assert_eq!(at(1), [0]);
        assert_eq!(at(2), [0, 1]);
        assert_eq!(at(3), [0, 0, 1]);
        assert_eq!(at(4), [0, 0, 1, 1]);
        assert_eq!(at(5), [0, 0, 0, 1, 1]);
        // Fewer ranks than CPUs: one each, from the first.
        let many = [2, 3, 5, 7];
        assert_eq!(cpu_for(Bind::Core, 1, 2, &many), Some(5));
        assert_eq!(cpu_for(Bind::None, 0, 2, &cpus), None);
        assert_eq!(cpu_for(Bind::Core, 0, 2, &[]), None);
        assert!(Bind::parse("socket").is_err());
    }

    #[test]
    fn this_process_has_cpus() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
        let set = single_cpu_set(cpus[0]);
        // SAFETY: plain reads of a set built by `single_cpu_set`.
        assert!(unsafe { libc::CPU_ISSET(cpus[0], &set) });
    }
}
