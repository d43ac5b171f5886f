//! Hosts and the map of ranks onto them, as Open MPI's `mpirun` reads and
//! does them: `-H host[:slots],...` and `--hostfile FILE` (`host slots=N`
//! a line) give each host a number of slots; `--map-by slot` fills each
//! host's slots in turn, `--map-by node` deals the ranks round-robin over
//! the hosts that still have a free slot. Everything here is pure.

/// One host and its slots (the most ranks ncclrun starts on it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Host {
    /// The name as given: what the agent is handed, `NCCL_HOSTID`'s value.
    pub(crate) name: String,
    /// At least 1.
    pub(crate) slots: usize,
}

/// Whether ranks on `name` run directly, without the agent.
pub(crate) fn is_local(name: &str) -> bool {
    name == "localhost" || name == "127.0.0.1"
}

/// Adds `slots` slots on `name`: a host named again gets them in the place
/// it was first named at, as with `mpirun`.
fn add(hosts: &mut Vec<Host>, name: &str, slots: usize) {
    match hosts.iter_mut().find(|h| h.name == name) {
        Some(h) => h.slots += slots,
        None => hosts.push(Host {
            name: name.to_string(),
            slots,
        }),
    }
}

/// A host name ncclrun accepts: not empty, no white space or control
/// characters, and not starting with `-` (the agent would read an option).
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty host name".into());
    }
    if name.starts_with('-') {
        return Err(format!("bad host name '{name}' (starts with '-')"));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("bad host name {name:?}"));
    }
    Ok(())
}

/// A slot count: a whole number, at least 1.
fn slot_count(v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| format!("bad slot count '{v}' (a whole number, at least 1)"))
}

/// Adds the hosts of one `-H` value, `host[:slots],...` (an IPv6 address
/// in brackets: `[::1]:2`), to `hosts`.
pub(crate) fn parse_h(spec: &str, hosts: &mut Vec<Host>) -> Result<(), String> {
    for entry in spec.split(',') {
        let (name, slots) = if let Some(rest) = entry.strip_prefix('[') {
            let (addr, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("-H entry '{entry}': no ']'"))?;
            match after {
                "" => (addr, 1),
                _ => match after.strip_prefix(':') {
                    Some(s) => (
                        addr,
                        slot_count(s).map_err(|e| format!("-H '{entry}': {e}"))?,
                    ),
                    None => return Err(format!("-H entry '{entry}': ':slots' expected after ']'")),
                },
            }
        } else {
            match entry.split(':').count() {
                1 => (entry, 1),
                2 => {
                    let (name, s) = entry.split_once(':').unwrap_or((entry, ""));
                    (
                        name,
                        slot_count(s).map_err(|e| format!("-H '{entry}': {e}"))?,
                    )
                }
                _ => {
                    return Err(format!(
                        "-H entry '{entry}': write an IPv6 address in brackets, [addr]:slots"
                    ))
                }
            }
        };
        check_name(name).map_err(|e| format!("-H '{spec}': {e}"))?;
        add(hosts, name, slots);
    }
    Ok(())
}

/// The hosts of a hostfile in Open MPI's format: `host [slots=N]` a line
/// (a bare host has 1 slot; `max_slots=N` is read and ignored, since
/// ncclrun never puts more ranks than slots on a host), `#` starts a
/// comment, blank lines are skipped, and a host named again gets more
/// slots. An error names the line (from 1).
pub(crate) fn parse_hostfile(text: &str) -> Result<Vec<Host>, String> {
    let mut hosts = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let at = i + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        check_name(name).map_err(|e| format!("line {at}: {e}"))?;
        let mut slots = None;
        for w in words {
            match w.split_once('=') {
                Some(("slots", v)) => {
                    if slots.is_some() {
                        return Err(format!("line {at}: slots given twice"));
                    }
                    slots = Some(slot_count(v).map_err(|e| format!("line {at}: {e}"))?);
                }
                Some(("max_slots" | "max-slots", v)) => {
                    slot_count(v).map_err(|e| format!("line {at}: max_slots: {e}"))?;
                }
                _ => return Err(format!("line {at}: unexpected '{w}' (host [slots=N])")),
            }
        }
        add(&mut hosts, name, slots.unwrap_or(1));
    }
    if hosts.is_empty() {
        return Err("no hosts in it".into());
    }
    Ok(hosts)
}

/// How ranks are mapped onto the hosts' slots (`--map-by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapBy {
    /// Fill each host's slots in turn (the default).
    Slot,
    /// Deal the ranks round-robin over the hosts, skipping full ones.
    Node,
}

impl MapBy {
    /// Parses `--map-by`'s value.
    pub(crate) fn parse(s: &str) -> Result<MapBy, String> {
        match s {
            "slot" => Ok(MapBy::Slot),
            "node" => Ok(MapBy::Node),
            _ => Err(format!("bad --map-by '{s}' (slot or node)")),
        }
    }
}

/// Where one rank runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    /// The index of its host in `-H`/hostfile order (`NODE_RANK`).
    pub(crate) host: usize,
    /// Its index among the ranks on that host, in rank order (`LOCAL_RANK`).
    pub(crate) local_rank: usize,
    /// How many ranks that host runs (`LOCAL_WORLD_SIZE`).
    pub(crate) local_size: usize,
}

/// Places ranks `0..n` on `hosts` by `by`; `n` defaults to every slot.
/// More ranks than slots is an error naming both numbers (ncclrun does not
/// oversubscribe); fewer take the first slots in map order.
pub(crate) fn map(hosts: &[Host], n: Option<usize>, by: MapBy) -> Result<Vec<Place>, String> {
    let total: usize = hosts.iter().map(|h| h.slots).sum();
    let n = n.unwrap_or(total);
    if n > total {
        return Err(format!(
            "-n {n} is more than the {total} slot(s) of the hosts given (ncclrun does not oversubscribe)"
        ));
    }
    let mut host_of = Vec::with_capacity(n);
    match by {
        MapBy::Slot => {
            for (h, host) in hosts.iter().enumerate() {
                host_of.extend(std::iter::repeat_n(h, host.slots));
            }
            host_of.truncate(n);
        }
        MapBy::Node => {
            let mut used = vec![0; hosts.len()];
            while host_of.len() < n {
                for (h, host) in hosts.iter().enumerate() {
                    if host_of.len() < n && used[h] < host.slots {
                        used[h] += 1;
                        host_of.push(h);
                    }
                }
            }
        }
    }
    let mut size = vec![0; hosts.len()];
    for &h in &host_of {
        size[h] += 1;
    }
    let mut next = vec![0; hosts.len()];
    Ok(host_of
        .into_iter()
        .map(|h| {
            next[h] += 1;
            Place {
                host: h,
                local_rank: next[h] - 1,
                local_size: size[h],
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(v: &[(&str, usize)]) -> Vec<Host> {
        v.iter()
            .map(|(n, s)| Host {
                name: n.to_string(),
                slots: *s,
            })
            .collect()
    }

    #[test]
    fn dash_h() {
        #[allow(clippy::type_complexity)]
        let table: &[(&[&str], Result<&[(&str, usize)], &str>)] = &[
            (&["a"], Ok(&[("a", 1)])),
            (&["a:2,b"], Ok(&[("a", 2), ("b", 1)])),
            (&["a:2,b:3,a"], Ok(&[("a", 3), ("b", 3)])),
            (&["a", "b:2", "a:2"], Ok(&[("a", 3), ("b", 2)])),
            (&["10.0.0.1:4"], Ok(&[("10.0.0.1", 4)])),
            (&["[::1]:2,[fe80::1]"], Ok(&[("::1", 2), ("fe80::1", 1)])),
            (&["a:0"], Err("bad slot count '0'")),
            (&["a:x"], Err("bad slot count 'x'")),
            (&["a:"], Err("bad slot count ''")),
            (&["a,,b"], Err("empty host name")),
            (&[""], Err("empty host name")),
            (&[":2"], Err("empty host name")),
            (&["-oProxyCommand=x"], Err("starts with '-'")),
            (&["fe80::1"], Err("in brackets")),
            (&["[::1"], Err("no ']'")),
            (&["[::1]2"], Err("':slots' expected")),
        ];
        for (specs, want) in table {
            let mut got = Vec::new();
            let r = specs.iter().try_for_each(|s| parse_h(s, &mut got));
            match want {
                Ok(w) => {
                    assert_eq!(r, Ok(()), "{specs:?}");
                    assert_eq!(got, hosts(w), "{specs:?}");
                }
                Err(w) => {
                    let e = r.expect_err(&format!("{specs:?} parsed"));
                    assert!(e.contains(w), "{specs:?}: {e}");
                }
            }
        }
    }

    #[test]
    fn hostfiles() {
        let good = "# the cluster\n\
                    \n\
                    node0 slots=4\n\
                    node1   # one slot\n\
                    \tnode2 slots=2 max_slots=8\n\
                    node0 slots=2 # again: more slots\n\
                    10.1.2.3 slots=1\n";
        assert_eq!(
            parse_hostfile(good),
            Ok(hosts(&[
                ("node0", 6),
                ("node1", 1),
                ("node2", 2),
                ("10.1.2.3", 1)
            ]))
        );
        let bad: &[(&str, &str)] = &[
            ("a\nb slots=0\n", "line 2: bad slot count '0'"),
            ("a slots=x", "line 1: bad slot count 'x'"),
            ("a\n\n# c\nb slots=", "line 4: bad slot count ''"),
            ("a slots=2 slots=3", "line 1: slots given twice"),
            ("a cpus=2", "line 1: unexpected 'cpus=2'"),
            ("a\nb c", "line 2: unexpected 'c'"),
            ("a slots = 2", "line 1: unexpected 'slots'"),
            ("-a", "line 1: bad host name '-a'"),
            ("a max_slots=q", "line 1: max_slots: bad slot count 'q'"),
            ("# nothing\n\n", "no hosts"),
            ("", "no hosts"),
        ];
        for (text, want) in bad {
            let e = parse_hostfile(text).expect_err(text);
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
    }

    /// (host, local_rank, local_size) of each rank.
    fn places(h: &[(&str, usize)], n: Option<usize>, by: MapBy) -> Vec<(usize, usize, usize)> {
        map(&hosts(h), n, by)
            .unwrap()
            .into_iter()
            .map(|p| (p.host, p.local_rank, p.local_size))
            .collect()
    }

    #[test]
    fn maps() {
        use MapBy::{Node, Slot};
        #[allow(clippy::type_complexity)]
        let table: &[(
            &[(&str, usize)],
            Option<usize>,
            MapBy,
            &[(usize, usize, usize)],
        )] = &[
            (
                &[("a", 2), ("b", 2)],
                None,
                Slot,
                &[(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)],
            ),
            (
                &[("a", 2), ("b", 2)],
                None,
                Node,
                &[(0, 0, 2), (1, 0, 2), (0, 1, 2), (1, 1, 2)],
            ),
            // Fewer ranks than slots: the first slots in map order.
            (
                &[("a", 2), ("b", 2)],
                Some(3),
                Slot,
                &[(0, 0, 2), (0, 1, 2), (1, 0, 1)],
            ),
            (
                &[("a", 2), ("b", 2)],
                Some(3),
                Node,
                &[(0, 0, 2), (1, 0, 1), (0, 1, 2)],
            ),
            (
                &[("a", 4), ("b", 4)],
                Some(2),
                Slot,
                &[(0, 0, 2), (0, 1, 2)],
            ),
            // Unequal slots: node skips the full hosts.
            (
                &[("a", 3), ("b", 1), ("c", 2)],
                None,
                Node,
                &[
                    (0, 0, 3),
                    (1, 0, 1),
                    (2, 0, 2),
                    (0, 1, 3),
                    (2, 1, 2),
                    (0, 2, 3),
                ],
            ),
            (
                &[("a", 3), ("b", 1), ("c", 2)],
                Some(5),
                Node,
                &[(0, 0, 2), (1, 0, 1), (2, 0, 2), (0, 1, 2), (2, 1, 2)],
            ),
            (
                &[("a", 1), ("b", 3)],
                None,
                Node,
                &[(0, 0, 1), (1, 0, 3), (1, 1, 3), (1, 2, 3)],
            ),
            (
                &[("a", 3), ("b", 1), ("c", 2)],
                None,
                Slot,
                &[
                    (0, 0, 3),
                    (0, 1, 3),
                    (0, 2, 3),
                    (1, 0, 1),
                    (2, 0, 2),
                    (2, 1, 2),
                ],
            ),
            // The local case: one host, every rank on it.
            (
                &[("localhost", 3)],
                None,
                Slot,
                &[(0, 0, 3), (0, 1, 3), (0, 2, 3)],
            ),
        ];
        for (h, n, by, want) in table {
            assert_eq!(places(h, *n, *by), *want, "{h:?} -n {n:?} {by:?}");
        }
        let e = map(&hosts(&[("a", 2), ("b", 2)]), Some(5), Slot).unwrap_err();
        assert!(e.contains("-n 5") && e.contains("4 slot"), "{e}");
        assert_eq!(MapBy::parse("node"), Ok(Node));
        assert!(MapBy::parse("core").is_err());
    }

    #[test]
    fn local_hosts() {
        assert!(is_local("localhost") && is_local("127.0.0.1"));
        assert!(!is_local("ncrun0") && !is_local("localhost.example"));
    }
}
