//! `NCCL_ALGO` and `NCCL_PROTO`: one syntax for both.
//!
//! A spec is a comma-separated list of names (case-insensitive), applying
//! to every collective, or `;`-separated parts `collective:list`
//! (`allreduce:tree;broadcast:ring`), each overriding the global list for
//! its collective. A list starting with `^` names what is excluded.
//! Unknown names and unknown collectives are errors naming the variable.
//!
//! Protocols: NCCL's `LL`, `LL128` and `Simple`. `LL` allows the direct
//! (one-hop, low-latency) path; `Simple` allows the pipelined ones (ring,
//! tree, halving-doubling). `LL128` has no path of its own here (it is
//! NCCL's protocol for NVLink-class links): it counts as `Simple`, so
//! `NCCL_PROTO=LL128` rules the direct path out as `Simple` does and
//! `NCCL_PROTO=^LL128` changes nothing.

use super::{Algo, ALGOS};
use crate::error::{Error, Result};

/// The collective names of the per-collective syntax.
pub(super) const COLL_KEYS: [&str; 8] = [
    "allreduce",
    "reducescatter",
    "allgather",
    "broadcast",
    "reduce",
    "alltoall",
    "gather",
    "scatter",
];

/// NCCL's protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proto {
    /// Low latency: the direct path.
    Ll,
    /// NCCL's 128-byte low-latency protocol; counts as [`Proto::Simple`].
    Ll128,
    /// The pipelined paths.
    Simple,
}

pub(super) const PROTOS: [Proto; 3] = [Proto::Ll, Proto::Ll128, Proto::Simple];

impl Proto {
    fn parse(s: &str) -> Option<Proto> {
        match s.to_ascii_lowercase().as_str() {
            "ll" => Some(Proto::Ll),
            "ll128" => Some(Proto::Ll128),
            "simple" => Some(Proto::Simple),
            _ => None,
        }
    }
}

/// How a name of a list reads.
enum Name<T> {
    Known(T),
    /// A valid name of NCCL's with nothing to select here.
    Ignored,
    Unknown,
}

/// `(collective key or "*", allowed items)`, in the order written; a
/// later part for the same key wins.
pub(super) type Rules<T> = Vec<(String, Vec<T>)>;

/// Parses `spec` of `var`; `all` is every item, `valid` the names for
/// error messages. An exclusion list that leaves nothing is an error; an
/// inclusion list of ignored names only allows everything.
fn parse<T: Copy + PartialEq>(
    var: &str,
    spec: &str,
    all: &[T],
    valid: &str,
    name: impl Fn(&str) -> Name<T>,
) -> Result<Rules<T>> {
    let bad = |why: String| {
        Error::InvalidArgument(format!(
            "{var}={spec:?} is not valid: {why}; expected a comma-separated list of {valid} \
             (^ excludes), optionally per collective as `allreduce:LIST;allgather:^LIST` \
             (collectives: {})",
            COLL_KEYS.join(", ")
        ))
    };
    let mut rules = Vec::new();
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, list) = match part.split_once(':') {
            Some((k, l)) => (k.trim().to_ascii_lowercase(), l.trim()),
            None => ("*".to_string(), part),
        };
        if key != "*" && !COLL_KEYS.contains(&key.as_str()) {
            return Err(bad(format!("unknown collective {key:?}")));
        }
        let (exclude, list) = match list.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, list),
        };
        let mut named = Vec::new();
        for n in list.split(',').map(str::trim) {
            match name(n) {
                Name::Known(x) => named.push(x),
                Name::Ignored => {}
                Name::Unknown => return Err(bad(format!("unknown name {n:?}"))),
            }
        }
        let allowed: Vec<T> = match (exclude, named.is_empty()) {
            (true, _) => all.iter().copied().filter(|a| !named.contains(a)).collect(),
            (false, true) => all.to_vec(),
            (false, false) => named,
        };
        if allowed.is_empty() {
            return Err(bad("it excludes every one".into()));
        }
        rules.push((key, allowed));
    }
    Ok(rules)
}

/// Parses `NCCL_ALGO`. NCCL's algorithms that do not apply to host memory
/// (CollNet, NVLS, PAT) are ignored, as NCCL ignores unavailable ones.
pub(super) fn algo_rules(spec: &str) -> Result<Rules<Algo>> {
    parse(
        "NCCL_ALGO",
        spec,
        &ALGOS,
        "ring, tree, direct, halvingdoubling (hd), hierarchical (hier), and NCCL's collnetdirect, collnetchain, \
         nvls, nvlstree, pat (ignored)",
        |n| match Algo::parse(n) {
            Some(a) => Name::Known(a),
            None if ["collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"]
                .contains(&n.to_ascii_lowercase().as_str()) =>
            {
                Name::Ignored
            }
            None => Name::Unknown,
        },
    )
}

/// Parses `NCCL_PROTO`.
pub(super) fn proto_rules(spec: &str) -> Result<Rules<Proto>> {
    parse("NCCL_PROTO", spec, &PROTOS, "LL, LL128, Simple", |n| {
        Proto::parse(n).map_or(Name::Unknown, Name::Known)
    })
}

/// The rule for collective `key`: its own, else the global one.
pub(super) fn rule_for<'a, T>(rules: &'a Rules<T>, key: &str) -> Option<&'a [T]> {
    let find = |k: &str| rules.iter().rev().find(|(r, _)| r == k);
    find(key).or_else(|| find("*")).map(|(_, v)| v.as_slice())
}

/// Checks `NCCL_ALGO` and `NCCL_PROTO` as a communicator's planner will
/// read them (for [`crate::Config::from_lookup`]).
pub(crate) fn check(algo: Option<&str>, proto: Option<&str>) -> Result<()> {
    if let Some(a) = algo {
        algo_rules(a)?;
    }
    if let Some(p) = proto {
        proto_rules(p)?;
    }
    Ok(())
}
