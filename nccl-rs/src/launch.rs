//! Reads rank, world size and root address from launcher environments:
//! torchrun, Open MPI, PMI and Slurm.
//!
//! The launchers' variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT`, `OMPI_COMM_WORLD_*`, `PMI_*`,
//! `MPI_LOCALRANKID`, `SLURM_*`) are not settings of this library, so they
//! are read here rather than into [`crate::Config`]; `NCCL_COMM_ID`, which
//! is one, comes from [`crate::Config::global`].

/// What a launcher told this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// Rank among the processes of this host.
    pub local_rank: usize,
    /// `host:port` of the bootstrap root, from `NCCL_COMM_ID` or
    /// `MASTER_ADDR`/`MASTER_PORT`.
    pub root: Option<String>,
    /// Which launcher: `"torchrun"`, `"openmpi"`, `"pmi"` or `"slurm"`.
    pub source: &'static str,
}

impl LaunchEnv {
    /// Reads the process environment: the launcher's variables, and
    /// `NCCL_COMM_ID` through [`crate::Config::global`] (ignored where the
    /// environment holds an invalid setting).
    pub fn detect() -> Option<LaunchEnv> {
        let comm_id = crate::Config::global().ok().and_then(|c| c.comm_id.clone());
        LaunchEnv::from_lookup(|k| match k {
            "NCCL_COMM_ID" => comm_id.clone(),
            _ => std::env::var(k).ok(),
        })
    }

    /// Reads through `get` (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Option<LaunchEnv> {
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<usize>().ok());
        const SOURCES: [(&str, &str, &str, &str); 4] = [
            ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
            (
                "openmpi",
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ),
            ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
            ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ];
        let (source, rank, size, local) = SOURCES
            .iter()
            .find_map(|&(src, r, s, l)| Some((src, num(r)?, num(s)?, num(l))))?;
        if size == 0 || rank >= size {
            return None;
        }
        let root = get("NCCL_COMM_ID").filter(|v| !v.is_empty()).or_else(|| {
            let (a, p) = (get("MASTER_ADDR")?, get("MASTER_PORT")?);
            Some(if a.contains(':') && !a.starts_with('[') {
                format!("[{a}]:{p}")
            } else {
                format!("{a}:{p}")
            })
        });
        Some(LaunchEnv {
            rank,
            size,
            local_rank: local.unwrap_or(rank),
            root,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Option<LaunchEnv> {
        let m: HashMap<_, _> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn each_launcher() {
        let t = env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(
            (t.rank, t.size, t.source, t.root.as_deref()),
            (2, 4, "torchrun", Some("10.0.0.1:29500"))
        );
        let o = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("NCCL_COMM_ID", "h:1"),
        ])
        .unwrap();
        assert_eq!(
            (o.rank, o.size, o.source, o.root.as_deref()),
            (1, 2, "openmpi", Some("h:1"))
        );
        assert_eq!(
            env(&[("PMI_RANK", "0"), ("PMI_SIZE", "3")]).unwrap().source,
            "pmi"
        );
        let s = env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
        ])
        .unwrap();
        assert_eq!((s.rank, s.local_rank, s.root), (5, 1, None));
        let v6 = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "9"),
        ])
        .unwrap();
        assert_eq!(v6.root.as_deref(), Some("[::1]:9"));
    }

    #[test]
    fn nonsense_is_ignored() {
        assert_eq!(env(&[]), None);
        assert_eq!(env(&[("RANK", "4"), ("WORLD_SIZE", "4")]), None);
        assert_eq!(env(&[("RANK", "x"), ("WORLD_SIZE", "4")]), None);
    }
}
