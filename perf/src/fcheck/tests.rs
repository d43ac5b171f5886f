use super::*;

#[test]
fn rounds_exact_for_small_counts() {
    let none: Vec<Vec<(usize, usize)>> = Vec::new();
    assert_eq!(rounds(0), none);
    assert_eq!(rounds(1), none);
    assert_eq!(rounds(2), vec![vec![(0, 1)]]);
    assert_eq!(rounds(3), vec![vec![(1, 2)], vec![(0, 2)], vec![(0, 1)]]);
    assert_eq!(
        rounds(4),
        vec![
            vec![(0, 3), (1, 2)],
            vec![(0, 2), (1, 3)],
            vec![(0, 1), (2, 3)]
        ]
    );
    assert_eq!(
        rounds(5),
        vec![
            vec![(1, 4), (2, 3)],
            vec![(0, 2), (3, 4)],
            vec![(0, 4), (1, 3)],
            vec![(0, 1), (2, 4)],
            vec![(0, 3), (1, 2)],
        ]
    );
}

#[test]
fn rounds_cover_every_pair_once_and_share_no_host() {
    for n in 2..=33 {
        let plan = rounds(n);
        assert_eq!(plan.len(), if n % 2 == 0 { n - 1 } else { n }, "{n}");
        let mut seen = vec![vec![0u32; n]; n];
        for round in &plan {
            assert_eq!(round.len(), n / 2, "{n}: {round:?}");
            let mut busy = vec![false; n];
            for &(a, b) in round {
                assert!(a < b && b < n, "{n}: {a} {b}");
                assert!(!busy[a] && !busy[b], "{n}: host twice in {round:?}");
                busy[a] = true;
                busy[b] = true;
                seen[a][b] += 1;
            }
        }
        for (a, row) in seen.iter().enumerate() {
            for (b, &count) in row.iter().enumerate().skip(a + 1) {
                assert_eq!(count, 1, "{n}: pair {a} {b}");
            }
        }
    }
}

#[test]
fn batches_split_a_round() {
    let round = [(0, 5), (1, 4), (2, 3)];
    let all = vec![round.to_vec()];
    assert_eq!(batches(&round, 0), all);
    assert_eq!(batches(&round, 3), all);
    assert_eq!(batches(&round, 9), all);
    assert_eq!(batches(&round, 2), vec![vec![(0, 5), (1, 4)], vec![(2, 3)]]);
    assert_eq!(
        batches(&round, 1),
        vec![vec![(0, 5)], vec![(1, 4)], vec![(2, 3)]]
    );
    assert!(batches(&[], 0).is_empty());
}

#[test]
fn medians_and_quantiles() {
    // (values, median, 10th percentile)
    let table: &[(&[f64], f64, f64)] = &[
        (&[], 0.0, 0.0),
        (&[3.0], 3.0, 3.0),
        (&[4.0, 1.0], 2.5, 1.0),
        (&[5.0, 1.0, 3.0], 3.0, 1.0),
        (&[f64::NAN, 2.0, 8.0, f64::INFINITY], 5.0, 2.0),
        (
            &[10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0],
            5.0,
            1.0,
        ),
    ];
    for (v, med, p10) in table {
        assert_eq!(median(v), *med, "{v:?}");
        assert_eq!(quantile(v, 0.1), *p10, "{v:?}");
    }
    assert_eq!(quantile(&[1.0, 2.0, 3.0], 1.0), 3.0);
    assert_eq!(quantile(&[1.0, 2.0, 3.0], 0.0), 1.0);
}

const GOOD: Sample = Sample {
    gbps: 0.19,
    lat_us: 70.0,
    retrans: 2,
    segs: 1000,
};

fn names(n: usize) -> Vec<String> {
    (0..n).map(|h| format!("h{h}")).collect()
}

/// A fabric of `hosts` x `rails` whose every link direction is `GOOD`,
/// then `edit` applied to each `(rail, src, dst, sample)`.
fn fabric(hosts: usize, rails: usize, edit: impl Fn(usize, usize, usize, &mut Sample)) -> Matrix {
    let nics = (0..rails)
        .map(|r| (0..hosts).map(|_| format!("rail{r}")).collect())
        .collect();
    let mut m = Matrix::new(names(hosts), rails, nics);
    let links: Vec<_> = m.links().collect();
    for (r, s, d) in links {
        let i = m.index(r, s, d);
        m.cells[i] = GOOD;
        edit(r, s, d, &mut m.cells[i]);
    }
    m
}

fn slow(c: &mut Sample) {
    c.gbps = GOOD.gbps / 4.0;
}

fn lossy(c: &mut Sample) {
    c.retrans = 60;
}

fn subjects(m: &Matrix) -> Vec<(Subject, Vec<Kind>)> {
    find_outliers(m, &Limits::default())
        .into_iter()
        .map(|o| (o.subject, o.kinds))
        .collect()
}

#[test]
fn outliers_name_the_faulty_part() {
    use Dir::*;
    use Kind::*;
    type Case = (&'static str, Matrix, Vec<(Subject, Vec<Kind>)>);
    let cases: Vec<Case> = vec![
        ("clean", fabric(4, 2, |_, _, _, _| {}), vec![]),
        (
            "one NIC at a quarter, both ways",
            fabric(4, 2, |r, s, d, c| {
                if r == 1 && (s == 2 || d == 2) {
                    slow(c)
                }
            }),
            vec![(
                Subject::HostRail {
                    host: 2,
                    rail: 1,
                    dir: Both,
                },
                vec![Slow],
            )],
        ),
        (
            "one NIC slow sending only; its queue drops too",
            fabric(4, 2, |r, s, _, c| {
                if r == 0 && s == 3 {
                    slow(c);
                    lossy(c);
                }
            }),
            vec![(
                Subject::HostRail {
                    host: 3,
                    rail: 0,
                    dir: Out,
                },
                vec![Slow, Loss],
            )],
        ),
        (
            "one NIC slow receiving; one of its out links lossy: explained",
            fabric(4, 2, |r, s, d, c| {
                if r == 1 && d == 0 {
                    slow(c)
                }
                if r == 1 && s == 0 && d == 3 {
                    lossy(c)
                }
            }),
            vec![(
                Subject::HostRail {
                    host: 0,
                    rail: 1,
                    dir: In,
                },
                vec![Slow],
            )],
        ),
        (
            "a lossy host: every rail in, some out links slow",
            fabric(4, 2, |r, s, d, c| {
                if d == 1 {
                    lossy(c)
                }
                if s == 1 && d == (r + 2) % 4 {
                    slow(c)
                }
            }),
            vec![(Subject::Host { host: 1, dir: In }, vec![Loss])],
        ),
        (
            "a lossy host, and a dip on another link of a peer: the peer's NIC is not blamed",
            fabric(4, 2, |r, s, d, c| {
                if d == 1 {
                    lossy(c)
                }
                if r == 0 && s == 2 && d == 3 {
                    slow(c)
                }
            }),
            vec![
                (Subject::Host { host: 1, dir: In }, vec![Loss]),
                (
                    Subject::Link {
                        rail: 0,
                        src: 2,
                        dst: 3,
                    },
                    vec![Slow],
                ),
            ],
        ),
        (
            "a slow NIC, and a dip on another link of a peer: the peer's NIC is not blamed",
            fabric(4, 2, |r, s, d, c| {
                if r == 1 && (s == 2 || d == 2) {
                    slow(c)
                }
                if r == 1 && s == 0 && d == 3 {
                    slow(c)
                }
            }),
            vec![
                (
                    Subject::HostRail {
                        host: 2,
                        rail: 1,
                        dir: Both,
                    },
                    vec![Slow],
                ),
                (
                    Subject::Link {
                        rail: 1,
                        src: 0,
                        dst: 3,
                    },
                    vec![Slow],
                ),
            ],
        ),
        (
            "a host slow both ways on every rail",
            fabric(4, 3, |_, s, d, c| {
                if s == 0 || d == 0 {
                    slow(c)
                }
            }),
            vec![(Subject::Host { host: 0, dir: Both }, vec![Slow])],
        ),
        (
            "a host slow out on rail 0, in on rail 1",
            fabric(4, 2, |r, s, d, c| {
                if (r == 0 && s == 2) || (r == 1 && d == 2) {
                    slow(c)
                }
            }),
            vec![(Subject::Host { host: 2, dir: Both }, vec![Slow])],
        ),
        (
            "one rail: a bad host is its NIC",
            fabric(4, 1, |_, s, d, c| {
                if s == 3 || d == 3 {
                    lossy(c)
                }
            }),
            vec![(
                Subject::HostRail {
                    host: 3,
                    rail: 0,
                    dir: Both,
                },
                vec![Loss],
            )],
        ),
        (
            "one slow path between two leaves: a link",
            fabric(4, 2, |r, s, d, c| {
                if r == 0 && s == 0 && d == 3 {
                    slow(c)
                }
            }),
            vec![(
                Subject::Link {
                    rail: 0,
                    src: 0,
                    dst: 3,
                },
                vec![Slow],
            )],
        ),
        (
            "latency of one NIC, both ways",
            fabric(4, 2, |r, s, d, c| {
                if r == 0 && (s == 1 || d == 1) {
                    c.lat_us = 5.0 * GOOD.lat_us;
                }
            }),
            vec![(
                Subject::HostRail {
                    host: 1,
                    rail: 0,
                    dir: Both,
                },
                vec![Latency],
            )],
        ),
        (
            "latency of one link only: a moment's scheduling, not named",
            fabric(4, 2, |r, s, d, c| {
                if r == 1 && ((s, d) == (0, 3) || (s, d) == (3, 0)) {
                    c.lat_us = 9.0 * GOOD.lat_us;
                }
            }),
            vec![],
        ),
        (
            "latency and loss of one link: named for the loss only",
            fabric(4, 2, |r, s, d, c| {
                if r == 1 && (s, d) == (0, 3) {
                    c.lat_us = 9.0 * GOOD.lat_us;
                    lossy(c);
                }
            }),
            vec![(
                Subject::Link {
                    rail: 1,
                    src: 0,
                    dst: 3,
                },
                vec![Loss],
            )],
        ),
        (
            "latency within the factor",
            fabric(4, 2, |r, s, _, c| {
                if r == 0 && s == 1 {
                    c.lat_us = 3.9 * GOOD.lat_us;
                }
            }),
            vec![],
        ),
        (
            "bandwidth at the fraction is not slow",
            fabric(4, 2, |r, s, _, c| {
                if r == 0 && s == 1 {
                    c.gbps = GOOD.gbps * 0.7;
                }
            }),
            vec![],
        ),
        (
            "three hosts: a NIC slow out spoils both its links, each peer one",
            fabric(3, 2, |r, s, _, c| {
                if r == 1 && s == 1 {
                    slow(c)
                }
            }),
            vec![(
                Subject::HostRail {
                    host: 1,
                    rail: 1,
                    dir: Out,
                },
                vec![Slow],
            )],
        ),
        (
            "two hosts: a slow direction names both its ends",
            fabric(2, 1, |_, s, _, c| {
                if s == 0 {
                    slow(c)
                }
            }),
            vec![
                (
                    Subject::HostRail {
                        host: 0,
                        rail: 0,
                        dir: Out,
                    },
                    vec![Slow],
                ),
                (
                    Subject::HostRail {
                        host: 1,
                        rail: 0,
                        dir: In,
                    },
                    vec![Slow],
                ),
            ],
        ),
        (
            "one host: nothing to compare",
            fabric(1, 2, |_, _, _, _| {}),
            vec![],
        ),
    ];
    for (what, m, want) in cases {
        assert_eq!(subjects(&m), want, "{what}");
    }
}

#[test]
fn outliers_report_the_worst_link_against_the_median() {
    let m = fabric(4, 2, |r, s, d, c| {
        if r == 1 && d == 2 {
            c.gbps = 0.05 + s as f64 * 0.001;
        }
    });
    let o = find_outliers(&m, &Limits::default());
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].gbps, 0.05);
    assert_eq!(o[0].reference_gbps, 0.19);
}

#[test]
fn judging_one_link() {
    let lim = Limits::default();
    // (sample, medians (gbps, lat)) -> kinds
    let table: &[(Sample, f64, f64, &[Kind])] = &[
        (GOOD, 0.19, 70.0, &[]),
        (Sample { gbps: 0.1, ..GOOD }, 0.19, 70.0, &[Kind::Slow]),
        (
            Sample {
                lat_us: 281.0,
                ..GOOD
            },
            0.19,
            70.0,
            &[Kind::Latency],
        ),
        (
            Sample {
                lat_us: 280.0,
                ..GOOD
            },
            0.19,
            70.0,
            &[],
        ),
        (
            Sample {
                retrans: 21,
                ..GOOD
            },
            0.19,
            70.0,
            &[Kind::Loss],
        ),
        (
            Sample {
                retrans: 20,
                ..GOOD
            },
            0.19,
            70.0,
            &[],
        ),
        (Sample { segs: 0, ..GOOD }, 0.19, 70.0, &[]),
        (
            Sample {
                gbps: 0.0,
                lat_us: 1e6,
                retrans: 999,
                segs: 1000,
            },
            0.19,
            70.0,
            &[Kind::Slow, Kind::Latency, Kind::Loss],
        ),
        (
            Sample {
                lat_us: 1e6,
                ..GOOD
            },
            0.19,
            0.0,
            &[],
        ),
    ];
    for (s, g, l, want) in table {
        assert_eq!(judge(s, *g, *l, &lim), *want, "{s:?}");
    }
}

#[test]
fn allreduce_bound_and_finding() {
    // (ranks, hosts, rails, slowest) -> bound
    let table = [
        (8, 4, 2, 0.19, 2.0 * 0.19 * 7.0 / 8.0 * 4.0 / 3.0),
        (4, 4, 1, 1.0, 1.0),
        (2, 2, 1, 1.0, 1.0),
        (16, 2, 4, 0.5, 4.0 * 0.5 * 15.0 / 16.0 * 2.0),
        (4, 1, 2, 1.0, 0.0),
        (1, 1, 1, 1.0, 0.0),
    ];
    for (n, h, r, s, want) in table {
        let got = allreduce_bound(n, h, r, s);
        assert!((got - want).abs() < 1e-12, "{n} {h} {r} {s}: {got} {want}");
    }
    let lim = Limits::default();
    assert_eq!(allreduce_outlier(0.5, 1.0, &lim), None);
    assert_eq!(allreduce_outlier(0.3, 0.0, &lim), None);
    let o = allreduce_outlier(0.49, 1.0, &lim).expect("below half");
    assert_eq!(
        (o.subject, o.kinds, o.gbps, o.reference_gbps),
        (Subject::AllReduce, vec![Kind::Slow], 0.49, 1.0)
    );
    let never = Limits {
        ar_fraction: 0.0,
        ..lim
    };
    assert_eq!(allreduce_outlier(0.0, 1.0, &never), None);
}

#[test]
fn snmp_counters() {
    let text = "Ip: Forwarding DefaultTTL\nIp: 2 64\n\
        Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n\
        Tcp: 1 200 120000 -1 10 9 0 0 4 16545 31870 17 0 3 0\n\
        Udp: InDatagrams\nUdp: 5\n";
    assert_eq!(parse_snmp_tcp(text), Some((17, 31870)));
    assert_eq!(parse_snmp_tcp(""), None);
    assert_eq!(parse_snmp_tcp("Tcp: OutSegs RetransSegs\n"), None);
    assert_eq!(parse_snmp_tcp("Tcp: OutSegs RetransSegs\nTcp: 1\n"), None);
    assert_eq!(parse_snmp_tcp("Tcp: OutSegs RetransSegs\nTcp: 1 x\n"), None);
    assert_eq!(parse_snmp_tcp("Tcp: OutSegs X\nTcp: 1 2\n"), None);
    assert_eq!(
        parse_snmp_tcp("Tcp: RetransSegs OutSegs\nTcp: 3 9\n"),
        Some((3, 9))
    );
}

#[test]
fn options_parse() {
    let d = Options::default();
    assert_eq!(parse_options::<_, &str>([]), Ok(Some(d.clone())));
    assert_eq!(parse_options(["-h"]), Ok(None));
    assert_eq!(parse_options(["-b", "1M", "--help"]), Ok(None));
    let o = parse_options([
        "-b",
        "1M",
        "-n",
        "3",
        "--reps",
        "2",
        "--lat-iters",
        "20",
        "--ar-size",
        "0",
        "--ar-iters",
        "2",
        "--max-pairs",
        "1",
        "--fraction",
        "0.5",
        "--lat-factor",
        "8",
        "--loss",
        "0.05",
        "--ar-fraction",
        "0",
        "--timeout",
        "9.5",
        "--json",
        "/tmp/x.json",
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        o,
        Options {
            bytes: 1 << 20,
            iters: 3,
            reps: 2,
            lat_iters: 20,
            ar_bytes: 0,
            ar_iters: 2,
            max_pairs: 1,
            timeout_s: 9.5,
            limits: Limits {
                fraction: 0.5,
                lat_factor: 8.0,
                loss: 0.05,
                ar_fraction: 0.0
            },
            json: Some("/tmp/x.json".into()),
        }
    );
    let errors: &[(&[&str], &str)] = &[
        (&["-b"], "-b: missing value (or unknown flag)"),
        (&["-b", "0"], "-b \"0\": want at least 1 byte"),
        (&["-b", "x"], "not a size: \"x\""),
        (&["-n", "0"], "-n \"0\": want an integer >= 1"),
        (&["--reps", "0"], "--reps \"0\": want an integer >= 1"),
        (
            &["--fraction", "1.5"],
            "--fraction \"1.5\": want a number in 0..1",
        ),
        (
            &["--fraction", "NaN"],
            "--fraction \"NaN\": want a number in 0..1",
        ),
        (
            &["--lat-factor", "0.5"],
            "--lat-factor \"0.5\": want a number in 1..1000000000",
        ),
        (
            &["--timeout", "0"],
            "--timeout \"0\": want a number in 0.001..1000000000",
        ),
        (&["--bogus", "1"], "unknown flag \"--bogus\" (see -h)"),
    ];
    for (argv, want) in errors {
        assert_eq!(
            parse_options(argv.iter()),
            Err(want.to_string()),
            "{argv:?}"
        );
    }
}

fn small_report() -> Report {
    let mut m = fabric(2, 1, |_, s, _, c| {
        if s == 1 {
            c.gbps = 0.04;
        }
    });
    m.hosts = vec!["a".into(), "b\"".into()];
    let outliers = find_outliers(&m, &Limits::default());
    Report {
        matrix: m,
        bytes: 1024,
        iters: 2,
        reps: 3,
        rounds: 1,
        allreduce: AllReduce {
            bytes: 4096,
            nranks: 2,
            busbw_gbps: 0.03,
            bound_gbps: 0.04,
        },
        limits: Limits::default(),
        outliers,
    }
}

#[test]
fn table_is_exact() {
    let want = "\
# fabric_check: 2 hosts, 2 ranks, 1 rails; 1 rounds; best of 3 passes of 1024 B x 2 per link direction
# rail  from  to      Gbit/s    lat_us     retr%  flag
     0  a     b\"       0.190      70.0      0.20
     0  b\"    a        0.040      70.0      0.20  bandwidth
# median 0.115 Gbit/s, 70.0 us
# all-reduce 4096 B on 2 ranks: busbw 0.030 Gbit/s, bound 0.040 (slowest link), 0.75 of it
# outliers: 2
#   host a rail 0 (rail0, in): bandwidth; worst 0.040 Gbit/s of 0.115
#   host b\" rail 0 (rail0, out): bandwidth; worst 0.040 Gbit/s of 0.115
";
    assert_eq!(table(&small_report()), want);
}

#[test]
fn json_is_exact() {
    let want = concat!(
        "{\"hosts\":[\"a\",\"b\\\"\"],\"rails\":1,\"nics\":[[\"rail0\",\"rail0\"]],",
        "\"bytes\":1024,\"iters\":2,\"reps\":3,\"rounds\":1,",
        "\"limits\":{\"fraction\":0.7,\"lat_factor\":4,\"loss\":0.02,\"ar_fraction\":0.5},",
        "\"links\":[{\"rail\":0,\"src\":\"a\",\"dst\":\"b\\\"\",\"gbps\":0.19,\"lat_us\":70,\"retrans\":2,\"segs\":1000},",
        "{\"rail\":0,\"src\":\"b\\\"\",\"dst\":\"a\",\"gbps\":0.04,\"lat_us\":70,\"retrans\":2,\"segs\":1000}],",
        "\"allreduce\":{\"bytes\":4096,\"nranks\":2,\"busbw_gbps\":0.03,\"bound_gbps\":0.04},",
        "\"outliers\":[{\"kind\":\"host_rail\",\"host\":\"a\",\"rail\":0,\"dir\":\"in\",\"why\":[\"bandwidth\"],\"gbps\":0.04,\"reference_gbps\":0.115},",
        "{\"kind\":\"host_rail\",\"host\":\"b\\\"\",\"rail\":0,\"dir\":\"out\",\"why\":[\"bandwidth\"],\"gbps\":0.04,\"reference_gbps\":0.115}],",
        "\"ok\":false}\n"
    );
    assert_eq!(json(&small_report()), want);
    let mut clean = small_report();
    clean.outliers.clear();
    assert!(json(&clean).ends_with("\"outliers\":[],\"ok\":true}\n"));
}

#[test]
fn matrix_flattens_and_back() {
    let m = fabric(3, 2, |r, s, d, c| c.retrans = (r * 9 + s * 3 + d) as u64);
    let mut back = Matrix::new(m.hosts.clone(), m.rails, m.nics.clone());
    back.set_flat(&m.flat());
    assert_eq!(back, m);
}
