//! Rails: several NICs per host, each on its own network.
//!
//! A [`crate::TcpNet`] built by [`crate::TcpNet::new`] with an explicit
//! `NCCL_SOCKET_IFNAME` holds every interface it selects, in name order:
//! rail 0, 1, ... up to [`MAX_RAILS`] ([`pick_rails`]). Rail R of every
//! host is expected on the same network (switch, subnet), as on a cluster
//! with one NIC per GPU. Without `NCCL_SOCKET_IFNAME` it keeps one rail,
//! the first interface of the default rule: that rule also takes virtual
//! bridges (`virbr0`, ...) that carry the same address on every host, and a
//! connection from such a "rail" would reach the local host.
//!
//! A connection between two such nets uses `r` rails
//! ([`connection_rails`]): the smaller rail count of the two ends, or with
//! `NCCL_CROSS_NIC=1` the larger one. Its data socket count is the
//! listener's `nsocks` rounded up to a multiple of `r`
//! ([`connection_nsocks`]), so that striping, which deals a large message's
//! pieces round-robin over the data sockets, gives every rail the same
//! share. Data socket `k` (TCP socket index `k + 1`) leaves local rail
//! `(k mod r) mod local_rails` and goes to the peer's rail
//! `(k mod r) mod peer_rails` ([`socket_rails`]); the control socket (index
//! 0) and a one-socket connection stay on rail 0.
//!
//! The connecting side computes all of this from its own rail count and the
//! listener's handle, and tells the listener `r` and the socket count in
//! every greeting (see [`crate::handle`]); the listener accepts any `r` that
//! is consistent with its `nsocks`.

use crate::handle::{MAX_RAILS, MAX_SOCKS};
use crate::iface::Iface;
use crate::CrossNic;
use std::cmp::Ordering;

/// What [`pick_rails`] makes of the selected interfaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picked {
    /// The rails, rail 0 first.
    pub rails: Vec<Iface>,
    /// Interfaces selected but not used as rails, and why (to log as a
    /// warning).
    pub dropped: Vec<(Iface, &'static str)>,
}

/// The rails out of the interfaces `chosen` by `NCCL_SOCKET_IFNAME`
/// (`spec`; see [`crate::iface::select_interfaces`]). With an explicit
/// `spec`: every one, in name order (digits compared as numbers, so
/// `eth2` before `eth10`), keeping rail 0's address family and at most
/// [`MAX_RAILS`] (what a handle holds). Without one: the first interface
/// only (see the module docs).
pub fn pick_rails(chosen: Vec<Iface>, spec: Option<&str>) -> Picked {
    let mut rails = chosen;
    let mut dropped = Vec::new();
    if spec.map(str::trim).is_none_or(str::is_empty) {
        rails.truncate(1);
        return Picked { rails, dropped };
    }
    rails.sort_by(|a, b| natural_cmp(&a.name, &b.name));
    let Some(v4) = rails.first().map(|f| f.addr.is_ipv4()) else {
        return Picked { rails, dropped };
    };
    let mut kept = Vec::with_capacity(rails.len());
    for f in rails {
        if f.addr.is_ipv4() != v4 {
            dropped.push((f, "another address family than rail 0"));
        } else if kept.len() == MAX_RAILS {
            dropped.push((f, "a handle holds at most 5 rails"));
        } else {
            kept.push(f);
        }
    }
    Picked {
        rails: kept,
        dropped,
    }
}

/// Orders names with runs of digits compared as numbers (`rail2` <
/// `rail10`), so rail order follows the NICs' numbering on every host.
fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn runs(s: &str) -> impl Iterator<Item = (bool, &str)> {
        let mut rest = s;
        std::iter::from_fn(move || {
            let first = rest.chars().next()?;
            let digit = first.is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != digit)
                .unwrap_or(rest.len());
            let (run, tail) = rest.split_at(end);
            rest = tail;
            Some((digit, run))
        })
    }
    let (mut x, mut y) = (runs(a), runs(b));
    loop {
        let o = match (x.next(), y.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((true, p)), Some((true, q))) => {
                let (p, q) = (p.trim_start_matches('0'), q.trim_start_matches('0'));
                p.len().cmp(&q.len()).then_with(|| p.cmp(q))
            }
            (Some((_, p)), Some((_, q))) => p.cmp(q),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
}

/// Rails a connection uses between a side with `local` rails and one with
/// `peer` rails (each at least 1) under `cross`: the minimum (rail k to
/// rail k, extra rails of the richer side unused) unless `cross` is
/// [`CrossNic::On`], then the maximum (the poorer side's rails are reused
/// round-robin, so traffic crosses onto other networks). At most
/// [`MAX_RAILS`].
pub fn connection_rails(local: usize, peer: usize, cross: CrossNic) -> usize {
    let (l, p) = (local.clamp(1, MAX_RAILS), peer.clamp(1, MAX_RAILS));
    match cross {
        CrossNic::On => l.max(p),
        CrossNic::Off | CrossNic::Auto => l.min(p),
    }
}

/// Data sockets of a connection whose listener asks for `nsocks` (1..=
/// [`MAX_SOCKS`]) over `rails` rails: `nsocks` itself on one rail, else
/// `nsocks` rounded up to a multiple of `rails` (the largest multiple of
/// `rails` within [`MAX_SOCKS`] if that is more), so every rail carries as
/// many data sockets as every other.
pub fn connection_nsocks(nsocks: usize, rails: usize) -> usize {
    let n = nsocks.clamp(1, MAX_SOCKS);
    let r = rails.clamp(1, MAX_RAILS);
    if r == 1 {
        return n;
    }
    let up = n.div_ceil(r) * r;
    if up <= MAX_SOCKS {
        up
    } else {
        MAX_SOCKS / r * r
    }
}

/// `(local rail, peer rail)` of TCP socket `index` of a connection of
/// `nsocks` data sockets over `rails` rails, between a side with `local`
/// rails and one with `peer` rails. Index 0 (the control socket, or the
/// only socket) is on rail 0 at both ends; data socket `k = index - 1` is on
/// rail `k mod rails`, reduced modulo each side's rail count (which only
/// changes anything under [`CrossNic::On`]).
pub fn socket_rails(
    index: usize,
    nsocks: usize,
    rails: usize,
    local: usize,
    peer: usize,
) -> (usize, usize) {
    if index == 0 || nsocks <= 1 {
        return (0, 0);
    }
    let k = (index - 1) % rails.max(1);
    (k % local.max(1), k % peer.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, ip: &str) -> Iface {
        Iface::new(name, ip.parse().unwrap())
    }

    #[test]
    fn natural_order() {
        let mut v = ["rail10", "rail2", "eth1", "rail1", "rail02x", "rail", "ib0"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            ["eth1", "ib0", "rail", "rail1", "rail2", "rail02x", "rail10"]
        );
        assert_eq!(natural_cmp("eth01", "eth1"), "eth01".cmp("eth1"));
    }

    #[test]
    fn picking_rails() {
        let chosen = vec![
            f("rail1", "10.76.1.1"),
            f("rail10", "10.76.10.1"),
            f("rail0", "10.76.0.1"),
            f("rail6", "fd00::6"),
            f("rail2", "10.76.2.1"),
            f("rail3", "10.76.3.1"),
            f("rail4", "10.76.4.1"),
        ];
        let names = |v: &[Iface]| v.iter().map(|i| i.name.clone()).collect::<Vec<_>>();
        // Default rule: the first selected only, nothing to warn about.
        for spec in [None, Some(" ")] {
            let p = pick_rails(chosen.clone(), spec);
            assert_eq!(names(&p.rails), ["rail1"]);
            assert!(p.dropped.is_empty());
        }
        let p = pick_rails(chosen.clone(), Some("rail"));
        assert_eq!(
            names(&p.rails),
            ["rail0", "rail1", "rail2", "rail3", "rail4"]
        );
        assert_eq!(
            p.dropped,
            [
                (f("rail6", "fd00::6"), "another address family than rail 0"),
                (f("rail10", "10.76.10.1"), "a handle holds at most 5 rails"),
            ]
        );
        let p = pick_rails(chosen[..2].to_vec(), Some("=rail1,rail10"));
        assert_eq!(names(&p.rails), ["rail1", "rail10"]);
        assert!(pick_rails(Vec::new(), Some("x")).rails.is_empty());
    }

    #[test]
    fn rails_per_connection() {
        // (local, peer, cross) -> rails
        let table = [
            (1, 1, CrossNic::Auto, 1),
            (2, 2, CrossNic::Auto, 2),
            (2, 1, CrossNic::Auto, 1),
            (1, 2, CrossNic::Off, 1),
            (4, 3, CrossNic::Off, 3),
            (4, 3, CrossNic::On, 4),
            (1, 2, CrossNic::On, 2),
            (5, 5, CrossNic::On, 5),
            (9, 9, CrossNic::Auto, MAX_RAILS),
            (0, 3, CrossNic::Auto, 1),
        ];
        for (l, p, c, want) in table {
            assert_eq!(connection_rails(l, p, c), want, "{l} {p} {c:?}");
        }
    }

    #[test]
    fn sockets_per_connection() {
        // (nsocks, rails) -> data sockets
        let table = [
            (1, 1, 1),
            (3, 1, 3),
            (1, 2, 2),
            (3, 2, 4),
            (4, 2, 4),
            (3, 3, 3),
            (5, 4, 8),
            (64, 1, 64),
            (64, 2, 64),
            (64, 3, 63),
            (63, 5, 60),
            (62, 4, 64),
        ];
        for (n, r, want) in table {
            let got = connection_nsocks(n, r);
            assert_eq!(got, want, "{n} over {r}");
            assert!(got <= MAX_SOCKS && (r == 1 || got.is_multiple_of(r)));
        }
    }

    #[test]
    fn socket_to_rail_assignment() {
        // 4 data sockets over 2 rails, both sides with 2 rails: the control
        // socket and sockets 1, 3 on rail 0; sockets 2, 4 on rail 1.
        let got: Vec<_> = (0..5).map(|i| socket_rails(i, 4, 2, 2, 2)).collect();
        assert_eq!(got, [(0, 0), (0, 0), (1, 1), (0, 0), (1, 1)]);
        // One socket in all: rail 0 whatever the rails.
        assert_eq!(socket_rails(0, 1, 1, 3, 3), (0, 0));
        // 3 rails here, 2 there, no crossing: 2 rails used.
        let r = connection_rails(3, 2, CrossNic::Auto);
        let n = connection_nsocks(3, r);
        assert_eq!((r, n), (2, 4));
        let got: Vec<_> = (1..=n).map(|i| socket_rails(i, n, r, 3, 2)).collect();
        assert_eq!(got, [(0, 0), (1, 1), (0, 0), (1, 1)]);
        // Crossing: 3 rails used; local rail 2 goes to the peer's rail 0.
        let r = connection_rails(3, 2, CrossNic::On);
        let n = connection_nsocks(3, r);
        assert_eq!((r, n), (3, 3));
        let got: Vec<_> = (1..=n).map(|i| socket_rails(i, n, r, 3, 2)).collect();
        assert_eq!(got, [(0, 0), (1, 1), (2, 0)]);
        // Mirror: the listener has more rails.
        let got: Vec<_> = (1..=n).map(|i| socket_rails(i, n, r, 2, 3)).collect();
        assert_eq!(got, [(0, 0), (1, 1), (0, 2)]);
    }

    #[test]
    fn every_rail_gets_the_same_number_of_data_sockets() {
        for nsocks in 1..=MAX_SOCKS {
            for r in 1..=MAX_RAILS {
                let n = connection_nsocks(nsocks, r);
                let mut per = vec![0usize; r];
                for i in 1..=n {
                    if n > 1 {
                        per[socket_rails(i, n, r, r, r).0] += 1;
                    }
                }
                if n > 1 {
                    assert!(per.iter().all(|&c| c == n / r), "{nsocks} {r}: {per:?}");
                }
            }
        }
    }
}
