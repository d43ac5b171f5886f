use super::*;
use std::collections::HashMap;

fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| m.get(k).cloned())
}

#[test]
fn defaults_and_overrides() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c.buffsize, 4 << 20);
    assert_eq!(c.slot_bytes(), 512 << 10);
    assert_eq!(c.slot_bytes_for(false), 512 << 10);
    assert_eq!(c.slot_bytes_for(true), 256 << 10, "oversubscribed: 2 MiB");
    let set = cfg(&[("NCCL_BUFFSIZE", "8388608")]).unwrap();
    assert_eq!(
        set.slot_bytes_for(true),
        1 << 20,
        "NCCL_BUFFSIZE rules both"
    );
    let c = cfg(&[
        ("NCCL_BUFFSIZE", "1048576"),
        ("NCCL_RS_TIMEOUT", "2.5"),
        ("NCCL_SOCKET_FAMILY", "AF_INET6"),
    ])
    .unwrap();
    assert_eq!(c.buffsize, 1 << 20);
    assert_eq!(c.timeout, Duration::from_millis(2500));
    assert_eq!(c.socket_family, Some(AddrFamily::V6));
    assert_eq!(c.cross_nic, CrossNic::Auto);
    for (v, want) in [
        ("0", CrossNic::Off),
        ("1", CrossNic::On),
        ("2", CrossNic::Auto),
    ] {
        let c = cfg(&[("NCCL_CROSS_NIC", v)]).unwrap();
        assert_eq!(c.cross_nic, want, "{v}");
        assert_eq!(crate::comm::tcp_options(&c).cross_nic, want, "{v}");
        // Read once, for both network transports.
        assert_eq!(c.ib.cross_nic, want, "{v}");
    }
    assert!(c.shm_use_cma);
    assert_eq!(c.shm_cma_max_bytes, 2 << 20);
    use crate::plan::{Placement, PlacementMode};
    assert_eq!(c.placement, PlacementMode::Adaptive);
    let placement = |v| cfg(&[("NCCL_RS_PLACEMENT", v)]).map(|c| c.placement);
    assert_eq!(
        placement("apart").unwrap(),
        PlacementMode::Fixed(Placement::Apart)
    );
    assert_eq!(
        placement("0").unwrap(),
        PlacementMode::Fixed(Placement::Unknown)
    );
    assert!(placement("soon").is_err());
    assert!(c.ring_by_topology);
    let by_topology = |v| cfg(&[("NCCL_RS_RING_ORDER", v)]).unwrap().ring_by_topology;
    assert!(by_topology("topology") && !by_topology("rank"));
    assert!(c.local_register);
    assert_eq!(c.zero_copy_min_bytes, 32 << 10);
    let c2 = cfg(&[
        ("NCCL_LOCAL_REGISTER", "0"),
        ("NCCL_RS_ZERO_COPY_MIN_BYTES", "1"),
    ])
    .unwrap();
    assert!(!c2.local_register);
    assert_eq!(c2.zero_copy_min_bytes, 1);
    let c = cfg(&[
        ("NCCL_RS_SHM_SINGLE_COPY", "0"),
        ("NCCL_RS_SHM_SINGLE_COPY_MIN_BYTES", "4096"),
        ("NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES", "65536"),
        ("NCCL_RS_SHM_STREAM_BYTES", "0"),
    ])
    .unwrap();
    assert_eq!(c.shm_stream_bytes, Some(usize::MAX));
    assert_eq!(Config::default().shm_stream_bytes, None);
    assert!(cfg(&[("NCCL_RS_SHM_STREAM_BYTES", "-1")]).is_err());
    assert!(!c.shm_use_cma);
    assert_eq!(c.shm_cma_min_bytes, 4096);
    assert_eq!(c.shm_cma_max_bytes, 65536);
    assert!(
        cfg(&[("NCCL_RS_SHM_SINGLE_COPY", "1")])
            .unwrap()
            .shm_use_cma
    );
    assert!(cfg(&[("NCCL_RS_SHM_SINGLE_COPY", "on")]).is_err());
    let sndbuf = |v| cfg(&[("NCCL_RS_SOCKET_BUF_BYTES", v)]).map(|c| c.socket_buf_bytes);
    assert_eq!(sndbuf("0").unwrap(), 0, "the kernel's autotuning");
    assert_eq!(sndbuf("65536").unwrap(), 65536);
    assert!(sndbuf("100").is_err());
}

#[test]
fn bad_values_name_the_variable() {
    let e = cfg(&[("NCCL_BUFFSIZE", "lots")]).unwrap_err().to_string();
    assert!(e.contains("NCCL_BUFFSIZE"), "{e}");
    assert!(cfg(&[("NCCL_SHM_DISABLE", "yes")]).is_err());
    assert!(cfg(&[("NCCL_RS_TIMEOUT", "-1")]).is_err());
}

/// Values no numeric variable takes: not a number, negative, fractional,
/// past `u64`, with a unit, two numbers.
const NOT_A_COUNT: &[&str] = &[
    "lots",
    "-1",
    "1.5",
    "18446744073709551616",
    "99999999999999999999999",
    "4K",
    "1 2",
];

/// `(variable, values it rejects)`, for every variable `Config` reads;
/// each is rejected alone with an error naming the variable.
fn rejected() -> Vec<(&'static str, Vec<&'static str>)> {
    let count = |extra: &[&'static str]| [NOT_A_COUNT, extra].concat();
    let flag = || vec!["yes", "true", "on", "2", "-1", "01", "1.0"];
    let secs = || {
        vec![
            "soon", "-1", "0", "1e-12", "0.0001", "inf", "NaN", "1e9", "1e400", "10s",
        ]
    };
    vec![
        (
            "NCCL_SOCKET_IFNAME",
            vec![
                ",",
                ",,",
                "^",
                "=",
                "^=",
                "eth0 eth1",
                "eth0,en o1",
                "averyverylongname0",
                "eth/0",
                "eth0,\u{1}",
            ],
        ),
        (
            "NCCL_SOCKET_FAMILY",
            vec!["AF_UNIX", "inet", "5", "af_inet6x"],
        ),
        (
            "NCCL_RS_JOB_SECRET",
            vec![
                "secret",
                "00112233445566778899aabbccddeef",
                "00112233445566778899aabbccddeeff0",
                "0x112233445566778899aabbccddeeff",
                "00112233445566778899aabbccddeegg",
                "00112233445566778899aabbccdd\u{e9}e",
            ],
        ),
        (
            "NCCL_COMM_ID",
            vec![
                "host",
                ":5000",
                "host:",
                "host:0",
                "host:65536",
                "host:-1",
                "host:port",
                "::1:5000",
                "[::1]",
                "[::1]:0",
                "[nothex]:80",
                "a b:80",
            ],
        ),
        ("NCCL_BUFFSIZE", count(&["0", "4095", "1073741825"])),
        ("NCCL_RS_STEPS", count(&["0", "1", "65"])),
        ("NCCL_RS_PROM_INTERVAL_MS", count(&["86400001"])),
        ("NCCL_RS_TIMEOUT", secs()),
        ("NCCL_RS_BOOTSTRAP_TIMEOUT", secs()),
        ("NCCL_NSOCKS_PERTHREAD", count(&["0", "65"])),
        ("NCCL_SOCKET_NTHREADS", count(&["0", "17"])),
        ("NCCL_CROSS_NIC", vec!["3", "-1", "yes", "1.0"]),
        (
            "NCCL_ALGO",
            vec![
                "bogus",
                "ring,",
                "allreduc:ring",
                "^ring,tree,direct,hd,hier",
                "allreduce:",
                "LL128",
            ],
        ),
        (
            "NCCL_PROTO",
            vec![
                "bogus",
                "LL256",
                "LL,",
                "^",
                "^LL,LL128,Simple",
                "allreduc:LL",
                "allreduce:ring",
                "Simple;broadcast:",
            ],
        ),
        ("NCCL_NET", vec!["bogus", "IBext", "Socket,IB"]),
        ("NCCL_IB_DISABLE", flag()),
        ("NCCL_SHM_DISABLE", flag()),
        ("NCCL_RS_SHM_SINGLE_COPY", flag()),
        ("NCCL_LOCAL_REGISTER", flag()),
        ("NCCL_RS_SHM_SINGLE_COPY_MIN_BYTES", count(&[])),
        ("NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES", count(&[])),
        ("NCCL_RS_PLACEMENT", vec!["sideways", "2"]),
        ("NCCL_RS_RING_ORDER", vec!["leaf", "1"]),
        ("NCCL_RS_SHM_STREAM_BYTES", count(&[])),
        ("NCCL_RS_ZERO_COPY_MIN_BYTES", count(&[])),
        (
            "NCCL_RS_SOCKET_BUF_BYTES",
            count(&["100", "4095", "1073741825"]),
        ),
        ("NCCL_RS_SOCKET_SPLICE_MIN_BYTES", count(&[])),
        (
            "NCCL_RS_TOPO_OVERSUB",
            vec![
                "0.5",
                "0",
                "-2",
                "2,",
                ",2",
                "x",
                "NaN",
                "inf",
                "1001",
                "2:1",
                "1,1,1,1,1,1,1,1,1",
            ],
        ),
        ("NCCL_COMM_BLOCKING", flag()),
        (
            "NCCL_NET_GDR_LEVEL",
            vec!["x", "LOCAL", "-1", "1.5", "P I X"],
        ),
        ("NCCL_DMABUF_ENABLE", flag()),
        (
            "NCCL_RS_CUDA_STAGING_CHUNK",
            vec![
                "lots",
                "-1",
                "1.5",
                "12",
                "4095",
                "2T",
                "4G",
                "1 2",
                "K",
                "18446744073709551616G",
            ],
        ),
        ("NCCL_RS_CUDA_PIPELINE", flag()),
        (
            "NCCL_RS_CUDA_REDUCE",
            vec!["bogus", "gpus", "1", "host,gpu"],
        ),
        (
            "NCCL_IB_HCA",
            vec!["mlx5_0:x", "mlx5_0:256", "mlx5_0:1,mlx5_1:-1"],
        ),
        ("NCCL_IB_GID_INDEX", vec!["x", "65536", "-", "-x", "1.5"]),
        ("NCCL_IB_ADDR_FAMILY", vec!["AF_UNIX", "ipv4", "AF_INET4"]),
        (
            "NCCL_IB_ADDR_RANGE",
            vec!["10.0.0.0/33", "banana", "10.0.0.0", "fd00::/129"],
        ),
        ("NCCL_IB_ROCE_VERSION_NUM", vec!["0", "3", "x", "-1"]),
        ("NCCL_IB_TIMEOUT", vec!["0", "32", "x", "-1"]),
        ("NCCL_IB_RETRY_CNT", vec!["8", "x", "-1"]),
        ("NCCL_IB_TC", vec!["256", "x", "-1"]),
        ("NCCL_IB_SL", vec!["16", "x"]),
        ("NCCL_IB_QPS_PER_CONNECTION", vec!["0", "129", "x"]),
        ("NCCL_RAS_ENABLE", flag()),
        (
            "NCCL_RAS_ADDR",
            vec![
                "localhost",
                "localhost:0",
                "localhost:65536",
                ":28028",
                "a b:1",
            ],
        ),
        (
            "NCCL_RAS_TIMEOUT_FACTOR",
            vec!["0", "1001", "x", "-1", "1.5"],
        ),
    ]
}

/// `(variable, value, what the value means)`.
type Lenient = (&'static str, &'static str, fn(&Config) -> bool);

/// Variables whose odd values NCCL documents as accepted, with what they
/// then mean (every variable also takes an empty value as unset; see
/// `empty_values_are_unset`).
fn lenient() -> Vec<Lenient> {
    vec![
        // NCCL logs at its default level for a level it does not know.
        ("NCCL_DEBUG", "bogus", |c| {
            crate::logging::level_for(c.debug.as_deref()) == crate::logging::level_for(None)
        }),
        // A negative GID index: NCCL picks one.
        ("NCCL_IB_GID_INDEX", "-1", |c| c.ib.gid_index.is_none()),
        // NCCL ignores algorithms that are not available.
        ("NCCL_ALGO", "NVLS,ring", |c| {
            c.algo.as_deref() == Some("NVLS,ring")
        }),
        // LL128 counts as Simple (see `plan`).
        ("NCCL_PROTO", "^LL128", |c| {
            c.proto.as_deref() == Some("^LL128")
        }),
        // Any plugin name or path is taken as it is; `none` disables (at
        // init, as NCCL).
        ("NCCL_PROFILER_PLUGIN", "none", |c| {
            c.profiler_plugin.as_deref() == Some("none")
        }),
        // An `NCCL_IB_HCA` name that no device has selects nothing, at init.
        ("NCCL_IB_HCA", "nosuchdev", |c| {
            c.ib.hca.as_deref() == Some("nosuchdev")
        }),
        // File names and subsystem lists are taken as they are (NCCL
        // ignores subsystems it does not know).
        ("NCCL_DEBUG_FILE", "/tmp/nccl.%h.%p", |c| {
            c.debug_file.as_deref() == Some("/tmp/nccl.%h.%p")
        }),
        ("NCCL_DEBUG_SUBSYS", "^INIT,NOSUCH", |c| {
            c.debug_subsys.as_deref() == Some("^INIT,NOSUCH")
        }),
        // A host id is any text; the topology file is read (and its errors
        // reported) at init, the dump file written there.
        ("NCCL_HOSTID", "rack 3/node#7", |c| {
            c.host_id.as_deref() == Some("rack 3/node#7")
        }),
        ("NCCL_RS_TOPO_FILE", "/no/such/topology.conf", |c| {
            c.topo_file.as_deref() == Some("/no/such/topology.conf")
        }),
        ("NCCL_TOPO_DUMP_FILE", "topo.xml", |c| {
            c.topo_dump_file.as_deref() == Some("topo.xml")
        }),
        // Placeholders are expanded when the file is first written.
        ("NCCL_RS_PROM_FILE", "nccl-{rank}.prom", |c| {
            c.prom_file.as_deref() == Some("nccl-{rank}.prom")
        }),
        ("NCCL_RS_CUDA_DRIVER", "/opt/libcuda.so.1", |c| {
            c.cuda.driver.as_deref() == Some("/opt/libcuda.so.1")
        }),
        ("NCCL_RS_NVRTC_LIBRARY", "libnvrtc.so.12", |c| {
            c.cuda.nvrtc_library.as_deref() == Some("libnvrtc.so.12")
        }),
        // Any value but 0, false, no, off (any case) disables CUDA.
        ("NCCL_RS_CUDA_DISABLE", "yes", |c| c.cuda.disable),
        ("NCCL_RS_CUDA_DISABLE", "Off", |c| !c.cuda.disable),
        // Only 0 turns asynchronous calls off.
        ("NCCL_RS_CUDA_ASYNC", "no", |c| c.cuda.async_calls),
        ("NCCL_RS_CUDA_ASYNC", "0", |c| !c.cuda.async_calls),
    ]
}

#[test]
fn every_bad_value_is_rejected_naming_the_variable() {
    let mut rows = 0;
    for (var, values) in rejected() {
        for v in values {
            let e = match cfg(&[(var, v)]) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("{var}={v:?} was accepted"),
            };
            assert!(e.contains(var), "{var}={v:?}: {e}");
            rows += 1;
        }
    }
    assert!(rows > 200, "{rows} rows");
}

#[test]
fn lenient_values_have_the_documented_meaning() {
    for (var, v, means) in lenient() {
        let c = cfg(&[(var, v)]).unwrap_or_else(|e| panic!("{var}={v:?}: {e}"));
        assert!(means(&c), "{var}={v:?}");
    }
    // NCCL clamps the sockets per connection to 64 (`MAX_SOCKETS`).
    let c = cfg(&[
        ("NCCL_NSOCKS_PERTHREAD", "64"),
        ("NCCL_SOCKET_NTHREADS", "16"),
    ])
    .unwrap();
    assert_eq!(
        crate::comm::tcp_options(&c).nsocks,
        transport_tcp::MAX_SOCKS
    );
}

#[test]
fn empty_values_are_unset() {
    let unset = format!("{:?}", cfg(&[]).unwrap());
    for var in VARS {
        for v in ["", " ", " \t\n"] {
            let c = cfg(&[(var, v)]).unwrap_or_else(|e| panic!("{var}={v:?}: {e}"));
            assert_eq!(format!("{c:?}"), unset, "{var}={v:?}");
        }
    }
}

#[test]
fn the_tables_cover_every_variable_read() {
    let asked = std::cell::RefCell::new(Vec::<String>::new());
    Config::from_lookup(|k| {
        asked.borrow_mut().push(k.to_string());
        None
    })
    .unwrap();
    let mut asked = asked.into_inner();
    asked.sort();
    asked.dedup();
    let mut vars: Vec<String> = VARS.iter().map(|v| v.to_string()).collect();
    vars.sort();
    assert_eq!(asked, vars, "VARS lists what from_lookup reads");
    let tabled: Vec<&str> = rejected()
        .into_iter()
        .map(|(v, _)| v)
        .chain(lenient().into_iter().map(|(v, _, _)| v))
        .collect();
    for var in VARS {
        assert!(tabled.contains(var), "{var} has no row");
    }
}

#[test]
fn the_largest_spliced_message_follows_the_cache_not_a_variable() {
    let c = cfg(&[("NCCL_RS_SOCKET_SPLICE_MIN_BYTES", "4194304")]).unwrap();
    assert_eq!(c.socket_splice_min_bytes, 4 << 20);
    assert_eq!(
        c.socket_splice_max_bytes,
        transport_tcp::default_splice_max_bytes()
    );
    assert_eq!(
        cfg(&[("NCCL_RS_SOCKET_SPLICE_MIN_BYTES", "0")])
            .unwrap()
            .socket_splice_min_bytes,
        0,
        "0: never"
    );
    assert!(!VARS.iter().any(|v| v.contains("SPLICE_MAX")));
}

#[test]
fn device_settings_parse() {
    let d = cfg(&[]).unwrap().cuda;
    assert_eq!(d, CudaConfig::default());
    assert_eq!(d.staging_chunk_bytes, 2 << 20);
    assert!(d.pipeline && d.async_calls && d.dmabuf_enable && !d.disable);
    assert_eq!(d.reduce, DeviceReduce::Auto);
    assert_eq!(d.gdr_level, GdrLevel::Pxb);
    let c = cfg(&[
        ("NCCL_RS_CUDA_STAGING_CHUNK", "64K"),
        ("NCCL_RS_CUDA_PIPELINE", "0"),
        ("NCCL_RS_CUDA_REDUCE", "GPU"),
        ("NCCL_NET_GDR_LEVEL", "7"),
        ("NCCL_DMABUF_ENABLE", "0"),
        ("NCCL_RS_CUDA_DISABLE", "1"),
    ])
    .unwrap()
    .cuda;
    assert_eq!(c.staging_chunk_bytes, 64 << 10);
    assert!(!c.pipeline && !c.dmabuf_enable && c.disable);
    assert_eq!(c.reduce, DeviceReduce::Gpu);
    assert_eq!(c.gdr_level, GdrLevel::Sys, "NCCL's integers past 4 are SYS");
    assert_eq!(
        cfg(&[("NCCL_RS_CUDA_REDUCE", "cpu")]).unwrap().cuda.reduce,
        DeviceReduce::Host
    );
    assert_eq!(
        cfg(&[("NCCL_NET_GDR_LEVEL", "phb")])
            .unwrap()
            .cuda
            .gdr_level,
        GdrLevel::Phb
    );
}

#[test]
fn logging_settings_come_with_the_config() {
    let c = cfg(&[
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ("NCCL_DEBUG_FILE", " nccl.%p.log "),
    ])
    .unwrap();
    assert_eq!(
        c.log(),
        LogSettings {
            debug: Some("INFO".into()),
            debug_file: Some("nccl.%p.log".into()),
            debug_subsys: Some("INIT,NET".into()),
        }
    );
}

/// The variables that are NCCL's own (checked against NCCL's documentation
/// and source): they keep NCCL's names and meanings.
const NCCL_OWN: &[&str] = &[
    "NCCL_RAS_ENABLE",
    "NCCL_RAS_ADDR",
    "NCCL_RAS_TIMEOUT_FACTOR",
    "NCCL_HOSTID",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY",
    "NCCL_COMM_ID",
    "NCCL_COMM_BLOCKING",
    "NCCL_BUFFSIZE",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_CROSS_NIC",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NET",
    "NCCL_IB_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_LOCAL_REGISTER",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_TC",
    "NCCL_IB_SL",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_DMABUF_ENABLE",
];

/// `(variable, whose)` of every row of the table in
/// `docs/configuration.md`: a row starts with a variable in backquotes,
/// its second cell says `NCCL` or `ours`.
fn documented() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration.md");
    doc.lines()
        .filter_map(|l| {
            let mut cells = l.strip_prefix("| `")?.split('|');
            let name = cells.next()?.trim().strip_suffix('`')?.to_string();
            let whose = cells.next()?.trim().to_string();
            Some((name, whose))
        })
        .collect()
}

#[test]
fn the_configuration_doc_lists_exactly_the_variables_read() {
    let rows = documented();
    let mut names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "a variable has two rows");
    let mut vars = VARS.to_vec();
    vars.sort();
    assert_eq!(names, vars, "docs/configuration.md against config::VARS");
    for (name, whose) in &rows {
        let nccl = NCCL_OWN.contains(&name.as_str());
        let want = if nccl { "NCCL" } else { "ours" };
        assert_eq!(whose, want, "{name}: whose");
    }
}

#[test]
fn every_variable_nccl_lacks_is_named_ours() {
    for var in VARS {
        assert!(
            NCCL_OWN.contains(var) || var.starts_with("NCCL_RS_"),
            "{var}: not NCCL's, so NCCL_RS_*"
        );
    }
    for var in NCCL_OWN {
        assert!(VARS.contains(var), "{var} is not read any more");
    }
}

#[test]
fn ras_settings_parse() {
    let d = cfg(&[]).unwrap();
    assert!(d.ras_enable);
    assert_eq!(
        (d.ras_addr.as_str(), d.ras_timeout_factor),
        ("localhost:28028", 1)
    );
    let c = cfg(&[
        ("NCCL_RAS_ENABLE", "0"),
        ("NCCL_RAS_ADDR", "10.0.0.1:29000"),
        ("NCCL_RAS_TIMEOUT_FACTOR", "3"),
    ])
    .unwrap();
    assert!(!c.ras_enable);
    assert_eq!(
        (c.ras_addr.as_str(), c.ras_timeout_factor),
        ("10.0.0.1:29000", 3)
    );
}

#[test]
fn good_values_of_the_checked_forms_pass() {
    for (var, v) in [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_SOCKET_IFNAME", "^docker,lo"),
        ("NCCL_SOCKET_IFNAME", "=eth0,eth1,"),
        ("NCCL_SOCKET_IFNAME", "veth"),
        ("NCCL_SOCKET_IFNAME", "enp0s31f6:1"),
        ("NCCL_RS_JOB_SECRET", "00112233445566778899aabbccddeeff"),
        ("NCCL_RS_JOB_SECRET", "00112233445566778899AABBCCDDEEFF"),
        ("NCCL_COMM_ID", "127.0.0.1:29500"),
        ("NCCL_COMM_ID", "node-7.cluster:1"),
        ("NCCL_COMM_ID", "[::1]:65535"),
        ("NCCL_COMM_ID", "[fe80::1%2]:5000"),
        ("NCCL_NET", "ib"),
        ("NCCL_NET", "Socket"),
        ("NCCL_PROTO", "LL,LL128,Simple"),
        ("NCCL_PROTO", "allreduce:^LL128;allgather:Simple"),
        ("NCCL_ALGO", "allreduce:tree;broadcast:ring"),
        ("NCCL_RS_TIMEOUT", "0.001"),
        ("NCCL_RS_SOCKET_BUF_BYTES", "00"),
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1"),
    ] {
        cfg(&[(var, v)]).unwrap_or_else(|e| panic!("{var}={v:?}: {e}"));
    }
    assert_eq!(
        cfg(&[("NCCL_RS_SOCKET_BUF_BYTES", "00")])
            .unwrap()
            .socket_buf_bytes,
        0,
        "0 however written: the kernel's autotuning"
    );
}

#[test]
fn values_that_are_not_utf8_are_errors_naming_the_variable() {
    use std::os::unix::ffi::OsStringExt;
    let e = Config::from_os_lookup(|k| {
        (k == "NCCL_PROTO").then(|| std::ffi::OsString::from_vec(vec![b'L', 0xff]))
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("NCCL_PROTO") && e.contains("UTF-8"), "{e}");
    let ok = Config::from_os_lookup(|k| (k == "NCCL_PROTO").then(|| "LL".into())).unwrap();
    assert_eq!(ok.proto.as_deref(), Some("LL"));
}

#[test]
fn a_job_secret_is_read_as_its_bytes() {
    let c = cfg(&[("NCCL_RS_JOB_SECRET", "000102030405060708090a0b0c0d0eFF")]).unwrap();
    let mut want = [0u8; 16];
    for (i, b) in want.iter_mut().enumerate() {
        *b = i as u8;
    }
    want[15] = 0xff;
    assert_eq!(c.job_secret, Some(want));
}

#[test]
fn topology_variables() {
    let c = cfg(&[]).unwrap();
    assert_eq!(
        (c.host_id, c.topo_file, c.topo_oversub, c.topo_dump_file),
        (None, None, vec![], None)
    );
    let c = cfg(&[
        ("NCCL_HOSTID", " fab-h3 "),
        ("NCCL_RS_TOPO_FILE", "/etc/slurm/topology.conf"),
        ("NCCL_TOPO_DUMP_FILE", "/tmp/topo.xml"),
    ])
    .unwrap();
    assert_eq!(c.host_id.as_deref(), Some("fab-h3"));
    assert_eq!(c.topo_file.as_deref(), Some("/etc/slurm/topology.conf"));
    assert_eq!(c.topo_dump_file.as_deref(), Some("/tmp/topo.xml"));
    let oversub = |v| cfg(&[("NCCL_RS_TOPO_OVERSUB", v)]).map(|c| c.topo_oversub);
    // (value, ratios or None for an error)
    let cases: &[(&str, Option<&[f64]>)] = &[
        ("2", Some(&[2.0])),
        ("2,1", Some(&[2.0, 1.0])),
        (" 1.5 , 3 ", Some(&[1.5, 3.0])),
        ("1,1,1,1,1,1,1,1", Some(&[1.0; 8])),
        ("1,1,1,1,1,1,1,1,1", None),
        ("0.5", None),
        ("2,", None),
        ("two", None),
        ("NaN", None),
        ("inf", None),
        ("1001", None),
        ("2:1", None),
    ];
    for (v, want) in cases {
        match want {
            Some(w) => assert_eq!(oversub(v).unwrap(), *w, "{v:?}"),
            None => {
                let e = oversub(v).unwrap_err().to_string();
                assert!(e.contains("NCCL_RS_TOPO_OVERSUB"), "{v:?}: {e}");
            }
        }
    }
}

#[test]
fn prometheus_file_variables() {
    let c = cfg(&[]).unwrap();
    assert_eq!(
        (c.prom_file, c.prom_interval),
        (None, Duration::from_secs(10))
    );
    let c = cfg(&[
        (
            "NCCL_RS_PROM_FILE",
            "/var/lib/node_exporter/nccl-{rank}.prom",
        ),
        ("NCCL_RS_PROM_INTERVAL_MS", "250"),
    ])
    .unwrap();
    assert_eq!(
        c.prom_file.as_deref(),
        Some("/var/lib/node_exporter/nccl-{rank}.prom")
    );
    assert_eq!(c.prom_interval, Duration::from_millis(250));
    let c = cfg(&[("NCCL_RS_PROM_FILE", ""), ("NCCL_RS_PROM_INTERVAL_MS", "0")]).unwrap();
    assert_eq!((c.prom_file, c.prom_interval), (None, Duration::ZERO));
    for v in ["-1", "1.5", "ten", "86400001"] {
        let e = cfg(&[("NCCL_RS_PROM_INTERVAL_MS", v)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("NCCL_RS_PROM_INTERVAL_MS"), "{v:?}: {e}");
    }
}
