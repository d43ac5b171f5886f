//! Rails: several ports per host, each on its own network.
//!
//! A [`crate::VerbsNet`] holds every active port `NCCL_IB_HCA` selects, in
//! NCCL's order (the verbs device list order, ports ascending), as rail 0,
//! 1, ... up to [`MAX_RAILS`] ([`pick_rails`]), as NCCL makes each such port
//! a network device and channel `c` uses NIC `c` on every host. Rail `k` of
//! every host is expected on the same fabric.
//!
//! A connection between two such nets uses `r` rails
//! ([`connection_rails`]): the smaller rail count of the two ends, or with
//! `NCCL_CROSS_NIC=1` the larger one. Connection rail `k` is local port
//! `k mod local_rails` and the peer's port `k mod peer_rails` (so rail k to
//! rail k whenever both ends have it). Its queue pairs are
//! `NCCL_IB_QPS_PER_CONNECTION` per rail, interleaved: QP `i` is on rail
//! `i mod r` ([`qp_rail`]). A message is split into at most one part per QP
//! (`crate::split_parts`), in QP order, so a large message gives every rail
//! the same share and a message below two parts' minimum (8 KiB) stays on
//! QP 0, rail 0, which also carries the clear-to-send entries and the
//! completion record: a small message then costs one write-with-immediate
//! on one rail, and needs no second registration (round-robin over rails
//! would not spread load better than channels already do, as each channel
//! has its own connection).

use crate::device::PortInfo;

/// Most rails a handle carries (`nccl_net::MAX_HANDLE_BYTES` / the handle
/// layout in [`crate::wire`]).
pub const MAX_RAILS: usize = 4;

/// `NCCL_CROSS_NIC`, shared with the TCP transport.
pub use nccl_net::CrossNic;

/// What [`pick_rails`] makes of the usable ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picked<'a> {
    /// The rails, rail 0 first.
    pub rails: Vec<&'a PortInfo>,
    /// Ports selected but not used as rails, and why (to log as a warning).
    pub dropped: Vec<(&'a PortInfo, &'static str)>,
}

/// The rails out of the `usable` ports (already filtered by `NCCL_IB_HCA`,
/// in discovery order): every one, in that order, keeping rail 0's link
/// layer (a queue pair joins two ports of one kind) and at most
/// [`MAX_RAILS`] (what a handle holds).
pub fn pick_rails<'a>(usable: &[&'a PortInfo]) -> Picked<'a> {
    let mut rails: Vec<&PortInfo> = Vec::with_capacity(usable.len().min(MAX_RAILS));
    let mut dropped = Vec::new();
    for &p in usable {
        match rails.first() {
            Some(r0) if r0.link_layer != p.link_layer => {
                dropped.push((p, "another link layer than rail 0"));
            }
            _ if rails.len() == MAX_RAILS => {
                dropped.push((p, "a handle holds at most 4 rails"));
            }
            _ => rails.push(p),
        }
    }
    Picked { rails, dropped }
}

/// Rails of a connection between a side with `local` rails and one with
/// `peer` rails (each at least 1) under `cross`: the minimum (rail k to
/// rail k, extra rails of the richer side unused) unless `cross` is
/// [`CrossNic::On`], then the maximum. At most [`MAX_RAILS`].
pub fn connection_rails(local: usize, peer: usize, cross: CrossNic) -> usize {
    let (l, p) = (local.max(1), peer.max(1));
    let r = match cross {
        CrossNic::On => l.max(p),
        CrossNic::Off | CrossNic::Auto => l.min(p),
    };
    r.min(MAX_RAILS)
}

/// The side's port (index into its rails) that connection rail `rail`
/// uses, on a side with `side_rails` rails.
pub fn port_of_rail(rail: usize, side_rails: usize) -> usize {
    rail % side_rails.max(1)
}

/// The connection rail of queue pair `qp` on a connection of `rails` rails.
pub fn qp_rail(qp: usize, rails: usize) -> usize {
    qp % rails.max(1)
}

/// Bytes each rail carries when `parts` (from `crate::split_parts`) go
/// over the connection's QPs, QP `i` carrying part `i`.
pub fn rail_bytes(parts: &[(usize, usize)], rails: usize) -> Vec<usize> {
    let mut out = vec![0; rails.max(1)];
    for (i, &(_, len)) in parts.iter().enumerate() {
        out[qp_rail(i, rails)] += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::LinkLayer;
    use crate::split_parts;

    fn port(dev: &str, p: u8, ll: LinkLayer) -> PortInfo {
        PortInfo {
            device: dev.into(),
            port: p,
            link_layer: Some(ll),
            active: true,
            mtu: 3,
            lid: 0,
            gid_tbl_len: 16,
            max_msg_sz: 1 << 30,
            speed_mbps: 0,
        }
    }

    fn names(p: &[&PortInfo]) -> Vec<String> {
        p.iter()
            .map(|p| format!("{}:{}", p.device, p.port))
            .collect()
    }

    #[test]
    fn rails_are_the_usable_ports_in_order() {
        use LinkLayer::{Ethernet as E, InfiniBand as I};
        let all = [
            port("mlx5_0", 1, I),
            port("mlx5_0", 2, I),
            port("rxe0", 1, E),
            port("mlx5_1", 1, I),
            port("mlx5_2", 1, I),
            port("mlx5_3", 1, I),
        ];
        let refs: Vec<&PortInfo> = all.iter().collect();
        // (usable ports by index, rails, dropped with reason)
        type Row<'a> = (&'a [usize], &'a [&'a str], &'a [(&'a str, &'a str)]);
        let table: &[Row<'_>] = &[
            (&[2], &["rxe0:1"], &[]),
            (&[0, 1], &["mlx5_0:1", "mlx5_0:2"], &[]),
            (
                &[0, 1, 2, 3],
                &["mlx5_0:1", "mlx5_0:2", "mlx5_1:1"],
                &[("rxe0:1", "another link layer than rail 0")],
            ),
            (
                &[2, 0],
                &["rxe0:1"],
                &[("mlx5_0:1", "another link layer than rail 0")],
            ),
            (
                &[0, 1, 3, 4, 5],
                &["mlx5_0:1", "mlx5_0:2", "mlx5_1:1", "mlx5_2:1"],
                &[("mlx5_3:1", "a handle holds at most 4 rails")],
            ),
            (&[], &[], &[]),
        ];
        for (usable, want, want_dropped) in table {
            let u: Vec<&PortInfo> = usable.iter().map(|&i| refs[i]).collect();
            let p = pick_rails(&u);
            assert_eq!(names(&p.rails), *want, "{usable:?}");
            let d: Vec<(String, &str)> = p
                .dropped
                .iter()
                .map(|(p, why)| (format!("{}:{}", p.device, p.port), *why))
                .collect();
            let wd: Vec<(String, &str)> = want_dropped
                .iter()
                .map(|(n, w)| ((*n).to_owned(), *w))
                .collect();
            assert_eq!(d, wd, "{usable:?}");
        }
    }

    #[test]
    fn connection_rails_and_cross_nic() {
        use CrossNic::{Auto, Off, On};
        // (local, peer, cross) -> rails
        let table = [
            (1, 1, Auto, 1),
            (2, 2, Auto, 2),
            (2, 1, Auto, 1),
            (1, 2, Off, 1),
            (4, 2, Off, 2),
            (1, 2, On, 2),
            (4, 2, On, 4),
            (3, 3, On, 3),
            (0, 0, Auto, 1),
            (9, 9, On, MAX_RAILS),
        ];
        for (l, p, c, want) in table {
            assert_eq!(connection_rails(l, p, c), want, "{l} {p} {c:?}");
        }
        assert_eq!(CrossNic::from_value(0), Some(Off));
        assert_eq!(CrossNic::from_value(1), Some(On));
        assert_eq!(CrossNic::from_value(2), Some(Auto));
        assert_eq!(CrossNic::from_value(3), None);
        assert_eq!(CrossNic::from_value(-1), None);
    }

    #[test]
    fn rail_to_port_and_qp_to_rail() {
        // Connection of 4 rails (cross) between a 4-rail and a 2-rail side.
        let ports: Vec<(usize, usize)> = (0..4)
            .map(|r| (port_of_rail(r, 4), port_of_rail(r, 2)))
            .collect();
        assert_eq!(ports, [(0, 0), (1, 1), (2, 0), (3, 1)]);
        let rails: Vec<usize> = (0..6).map(|q| qp_rail(q, 2)).collect();
        assert_eq!(rails, [0, 1, 0, 1, 0, 1]);
        assert_eq!(qp_rail(5, 1), 0);
    }

    #[test]
    fn stripes_are_equal_and_small_messages_stay_on_rail_0() {
        // (len, QPs per rail, rails) -> bytes per rail
        let table: &[(usize, usize, usize, &[usize])] = &[
            (0, 1, 2, &[0, 0]),
            (100, 1, 2, &[100, 0]),
            (8 << 10, 1, 2, &[8 << 10, 0]),
            ((8 << 10) + 1, 1, 2, &[(4 << 10) + 128, (4 << 10) - 127]),
            (4 << 20, 1, 2, &[2 << 20, 2 << 20]),
            (4 << 20, 2, 2, &[2 << 20, 2 << 20]),
            (12 << 20, 1, 3, &[4 << 20, 4 << 20, 4 << 20]),
            (8 << 20, 1, 4, &[2 << 20; 4]),
            (1 << 20, 1, 1, &[1 << 20]),
        ];
        for &(len, q, r, want) in table {
            let parts = split_parts(len, q * r);
            assert_eq!(
                rail_bytes(&parts, r),
                want,
                "{len} bytes, {q} QPs x {r} rails"
            );
        }
        // Any size: the rails' shares differ by at most one part.
        for len in [65_537, 3 << 20, 10_000_019] {
            let parts = split_parts(len, 4);
            let b = rail_bytes(&parts, 2);
            assert_eq!(b.iter().sum::<usize>(), len);
            let (lo, hi) = (b.iter().min().unwrap(), b.iter().max().unwrap());
            assert!(hi - lo <= parts[0].1, "{len}: {b:?}");
        }
    }
}
