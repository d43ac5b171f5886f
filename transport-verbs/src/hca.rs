//! `NCCL_IB_HCA`: which devices and ports to use, with NCCL's syntax.
//!
//! ```text
//! NCCL_IB_HCA = [^][=]entry[,entry...]      entry = name[:port]
//! ```
//! * Without `=`, `name` is a prefix: `mlx5` matches `mlx5_0` and `mlx5_12`.
//!   With `=` it must equal the device name.
//! * `:port` restricts the entry to that port; without it every port matches.
//! * A leading `^` inverts the whole list: the listed devices are excluded.
//! * Unset (or empty) selects every device and port.
//!
//! For example `^=mlx5_1` uses everything but `mlx5_1`; `mlx5_0:1,mlx5_1:1`
//! uses port 1 of each; `=rxe0` uses `rxe0` but not `rxe01`.

/// One `name[:port]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device name or prefix.
    pub name: String,
    /// Port, or `None` for any.
    pub port: Option<u8>,
}

/// A parsed `NCCL_IB_HCA` value.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HcaFilter {
    /// `^`: the list excludes.
    pub exclude: bool,
    /// `=`: names match exactly, not as prefixes.
    pub exact: bool,
    /// The entries; empty matches everything.
    pub entries: Vec<HcaEntry>,
}

impl HcaFilter {
    /// Parses an `NCCL_IB_HCA` value. Entries with an unparsable port are
    /// errors; empty entries (`"a,,b"`) are ignored, as NCCL does.
    pub fn parse(s: &str) -> Result<HcaFilter, String> {
        let mut rest = s.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let mut entries = Vec::new();
        for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, port) = match item.split_once(':') {
                None => (item, None),
                Some((n, p)) => {
                    let port = p
                        .parse::<u8>()
                        .map_err(|_| format!("bad port {p:?} in NCCL_IB_HCA entry {item:?}"))?;
                    (n, Some(port))
                }
            };
            entries.push(HcaEntry {
                name: name.to_owned(),
                port,
            });
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    /// Whether port `port` of device `dev` is selected.
    pub fn matches(&self, dev: &str, port: u8) -> bool {
        // NCCL: an empty list matches, and `^` inverts the answer.
        let listed = self.entries.is_empty()
            || self.entries.iter().any(|e| {
                let name_ok = if self.exact {
                    dev == e.name
                } else {
                    dev.starts_with(&e.name)
                };
                name_ok && (e.port.is_none() || e.port == Some(port))
            });
        listed != self.exclude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> HcaFilter {
        HcaFilter::parse(s).unwrap()
    }

    #[test]
    fn parses_nccl_syntax() {
        assert_eq!(f(""), HcaFilter::default());
        let p = f("^=mlx5_0:1, mlx5_1");
        assert!(p.exclude && p.exact);
        assert_eq!(
            p.entries,
            vec![
                HcaEntry {
                    name: "mlx5_0".into(),
                    port: Some(1)
                },
                HcaEntry {
                    name: "mlx5_1".into(),
                    port: None
                }
            ]
        );
        let p = f("=rxe0,,");
        assert!(!p.exclude && p.exact);
        assert_eq!(p.entries.len(), 1);
        assert!(HcaFilter::parse("mlx5_0:x").is_err());
        assert!(HcaFilter::parse("mlx5_0:300").is_err());
    }

    #[test]
    fn prefix_exact_port_and_exclusion() {
        let all = f("");
        assert!(all.matches("mlx5_0", 1) && all.matches("rxe0", 1));

        let prefix = f("mlx5");
        assert!(prefix.matches("mlx5_0", 1) && prefix.matches("mlx5_12", 2));
        assert!(!prefix.matches("rxe0", 1));

        let exact = f("=rxe0");
        assert!(exact.matches("rxe0", 1));
        assert!(!exact.matches("rxe01", 1));
        assert!(f("rxe0").matches("rxe01", 1), "prefix match without '='");

        let port = f("mlx5_0:2,mlx5_1");
        assert!(port.matches("mlx5_0", 2) && !port.matches("mlx5_0", 1));
        assert!(port.matches("mlx5_1", 1) && port.matches("mlx5_1", 2));

        let not = f("^mlx5_1");
        assert!(not.matches("mlx5_0", 1) && !not.matches("mlx5_1", 1));
        let not_exact_port = f("^=mlx5_0:1");
        assert!(!not_exact_port.matches("mlx5_0", 1));
        assert!(not_exact_port.matches("mlx5_0", 2));
        assert!(not_exact_port.matches("mlx5_00", 1));
        // NCCL's quirk: "^" with an empty list excludes everything.
        assert!(!f("^").matches("mlx5_0", 1));
    }
}
