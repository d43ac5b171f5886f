//! Each rank's environment, and the command line that starts a rank on
//! another host through the agent (`--rsh`, `ssh` by default, as Open
//! MPI's `plm_rsh_agent`). Everything here is pure.
//!
//! A rank on another host runs as `AGENT... HOST env -C DIR VAR=value ...
//! cmd args...`: GNU `env` (coreutils 8.28 or later on that host) moves to
//! ncclrun's current directory and sets the variables, then execs the
//! command. An agent whose program is `ssh` or `rsh` hands the remote side
//! one shell command line, so each word is shell-quoted; any other agent
//! (`ip netns exec`, ...) execs its arguments as they are.

use crate::hosts::Place;

/// The variables every rank gets from ncclrun (besides the job secret).
pub(crate) fn rank_vars(
    rank: usize,
    world: usize,
    place: Place,
    master_addr: &str,
    master_port: u16,
) -> Vec<(String, String)> {
    [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_RANK", place.local_rank.to_string()),
        ("LOCAL_WORLD_SIZE", place.local_size.to_string()),
        ("NODE_RANK", place.host.to_string()),
        ("MASTER_ADDR", master_addr.to_string()),
        ("MASTER_PORT", master_port.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// One `-x`: `VAR` (forward ncclrun's value) or `VAR=value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Export {
    pub(crate) name: String,
    pub(crate) value: Option<String>,
}

impl Export {
    /// Parses `-x`'s value; the name must be a shell variable name.
    pub(crate) fn parse(s: &str) -> Result<Export, String> {
        let (name, value) = match s.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (s, None),
        };
        let ok = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(format!("bad -x '{s}' (VAR or VAR=value)"));
        }
        Ok(Export {
            name: name.to_string(),
            value,
        })
    }
}

/// Sets `k` in `list`: in place if it is there (so a later source wins),
/// else at the end.
fn set(list: &mut Vec<(String, String)>, k: &str, v: &str) {
    match list.iter_mut().find(|(n, _)| n == k) {
        Some(e) => e.1 = v.to_string(),
        None => list.push((k.to_string(), v.to_string())),
    }
}

/// What ncclrun sets in a rank's environment, in this order, a later entry
/// winning over an earlier one of the same name:
/// - for a rank started through the agent (`remote`: the host's name):
///   every `NCCL_*` variable of ncclrun's environment `parent` (by name),
///   then `NCCL_HOSTID=<host>` unless `parent` has `NCCL_HOSTID`;
/// - the job secret ncclrun made (`None` when `parent` has one: a local
///   rank inherits it, a remote one got it with the `NCCL_*` variables);
/// - the `-x` variables: `VAR=value` as given, a bare `VAR` with its value
///   in `parent` (skipped when unset) for a remote rank and left to
///   inheritance for a local one;
/// - the rank variables ([`rank_vars`]), which no `-x` overrides.
///
/// A local rank gets these on top of ncclrun's own environment; a remote
/// one gets them on the agent's command line.
pub(crate) fn rank_env(
    parent: &[(String, String)],
    remote: Option<&str>,
    secret: Option<&str>,
    exports: &[Export],
    rank: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if let Some(host) = remote {
        let mut nccl: Vec<&(String, String)> = parent
            .iter()
            .filter(|(k, _)| k.starts_with("NCCL_"))
            .collect();
        nccl.sort();
        for (k, v) in nccl {
            set(&mut env, k, v);
        }
        if !parent.iter().any(|(k, _)| k == "NCCL_HOSTID") {
            set(&mut env, "NCCL_HOSTID", host);
        }
    }
    if let Some(s) = secret {
        set(&mut env, "NCCL_RS_JOB_SECRET", s);
    }
    for x in exports {
        match &x.value {
            Some(v) => set(&mut env, &x.name, v),
            None if remote.is_some() => {
                if let Some((_, v)) = parent.iter().find(|(k, _)| *k == x.name) {
                    set(&mut env, &x.name, v);
                }
            }
            None => {}
        }
    }
    for (k, v) in rank {
        set(&mut env, k, v);
    }
    env
}

/// `word` as one word of a POSIX shell command line: as it is when it has
/// only characters no shell treats specially, else in single quotes (a
/// `'` inside as `'\''`).
pub(crate) fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The `--rsh` agent: its words (split on white space).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Agent {
    words: Vec<String>,
}

impl Agent {
    /// Parses `--rsh`'s value.
    pub(crate) fn parse(s: &str) -> Result<Agent, String> {
        let words: Vec<String> = s.split_whitespace().map(str::to_string).collect();
        if words.is_empty() {
            return Err("empty --rsh".into());
        }
        Ok(Agent { words })
    }

    /// Whether the agent hands the remote side a shell command line: its
    /// program's base name is `ssh` or `rsh`.
    pub(crate) fn shell(&self) -> bool {
        let prog = self.words[0].rsplit('/').next().unwrap_or("");
        prog == "ssh" || prog == "rsh"
    }

    /// The command line that runs `cmd` on `host` in directory `dir` with
    /// `env` set: `AGENT... host env -C dir VAR=value... cmd...`, the words
    /// after `host` shell-quoted for a [`shell`](Agent::shell) agent.
    pub(crate) fn argv(
        &self,
        host: &str,
        dir: &str,
        env: &[(String, String)],
        cmd: &[String],
    ) -> Vec<String> {
        let mut remote = vec!["env".to_string(), "-C".to_string(), dir.to_string()];
        remote.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        remote.extend(cmd.iter().cloned());
        if self.shell() {
            remote = remote.iter().map(|w| shell_quote(w)).collect();
        }
        let mut argv = self.words.clone();
        argv.push(host.to_string());
        argv.extend(remote);
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn quoting() {
        let table = [
            ("plain-word_1.2/x:y,z@h%+=", "plain-word_1.2/x:y,z@h%+="),
            ("", "''"),
            ("two words", "'two words'"),
            ("it's", r"'it'\''s'"),
            ("$HOME", "'$HOME'"),
            ("a;b", "'a;b'"),
            ("*", "'*'"),
            ("~", "'~'"),
            ("echo $RANK \"x\"", "'echo $RANK \"x\"'"),
            ("tab\there", "'tab\there'"),
            ("line\nbreak", "'line\nbreak'"),
            ("ünï", "'ünï'"),
        ];
        for (word, want) in table {
            assert_eq!(shell_quote(word), want, "{word:?}");
        }
        // What a shell makes of the quoted words is the words.
        let words = ["a b", "it's", "$X", "", "*", "\\n", "'\"'", "-"];
        let line: Vec<String> = words.iter().map(|w| shell_quote(w)).collect();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\0' {}", line.join(" ")))
            .env("X", "expanded")
            .output()
            .unwrap();
        let got: Vec<&[u8]> = out.stdout.split(|&b| b == 0).collect();
        let want: Vec<&[u8]> = words
            .iter()
            .map(|w| w.as_bytes())
            .chain([&b""[..]])
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn agents() {
        let env = kv(&[("RANK", "2"), ("X", "a b")]);
        let cmd = s(&["sh", "-c", "echo $RANK"]);
        let ip = Agent::parse("ip netns exec").unwrap();
        assert!(!ip.shell());
        assert_eq!(
            ip.argv("ncrun1", "/work/d", &env, &cmd),
            s(&[
                "ip",
                "netns",
                "exec",
                "ncrun1",
                "env",
                "-C",
                "/work/d",
                "RANK=2",
                "X=a b",
                "sh",
                "-c",
                "echo $RANK"
            ])
        );
        let ssh = Agent::parse("  /usr/bin/ssh   -p 2222 ").unwrap();
        assert!(ssh.shell());
        assert_eq!(
            ssh.argv("node1", "/home/me/my dir", &env, &cmd),
            s(&[
                "/usr/bin/ssh",
                "-p",
                "2222",
                "node1",
                "env",
                "-C",
                "'/home/me/my dir'",
                "RANK=2",
                "'X=a b'",
                "sh",
                "-c",
                "'echo $RANK'"
            ])
        );
        assert!(Agent::parse("rsh").unwrap().shell());
        assert!(!Agent::parse("sshpass").unwrap().shell());
        assert!(!Agent::parse("docker exec").unwrap().shell());
        assert!(Agent::parse(" \t").is_err());
    }

    #[test]
    fn exports() {
        assert_eq!(
            Export::parse("A_1=x=y"),
            Ok(Export {
                name: "A_1".into(),
                value: Some("x=y".into())
            })
        );
        assert_eq!(
            Export::parse("_B"),
            Ok(Export {
                name: "_B".into(),
                value: None
            })
        );
        for bad in ["", "=x", "1A", "A-B=1", "A B"] {
            assert!(Export::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn environments() {
        let place = Place {
            host: 1,
            local_rank: 0,
            local_size: 2,
        };
        let rank = rank_vars(2, 4, place, "10.79.0.1", 29500);
        assert_eq!(
            rank,
            kv(&[
                ("RANK", "2"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "0"),
                ("LOCAL_WORLD_SIZE", "2"),
                ("NODE_RANK", "1"),
                ("MASTER_ADDR", "10.79.0.1"),
                ("MASTER_PORT", "29500"),
            ])
        );
        let parent = kv(&[
            ("PATH", "/bin"),
            ("NCCL_SOCKET_IFNAME", "eth"),
            ("NCCL_DEBUG", "INFO"),
            ("HOME", "/root"),
            ("FOO", "from-parent"),
            ("RANK", "7"),
        ]);
        let exports = [
            Export::parse("FOO").unwrap(),
            Export::parse("BAR=1").unwrap(),
            Export::parse("UNSET").unwrap(),
            Export::parse("NCCL_DEBUG=WARN").unwrap(),
            Export::parse("RANK=9").unwrap(),
        ];
        let short = |r: &[(String, String)]| -> Vec<String> {
            r.iter()
                .filter(|(k, _)| !rank.iter().any(|(n, _)| n == k))
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        #[allow(clippy::type_complexity)]
        let table: [(&[(String, String)], Option<&str>, Option<&str>, &[&str]); 5] = [
            // Local: only the secret and -x VAR=value on top of inheritance.
            (
                &parent,
                None,
                Some("s3"),
                &["NCCL_RS_JOB_SECRET=s3", "BAR=1", "NCCL_DEBUG=WARN"],
            ),
            (&parent, None, None, &["BAR=1", "NCCL_DEBUG=WARN"]),
            // Remote: NCCL_* by name, NCCL_HOSTID, the secret, -x (FOO
            // forwarded, UNSET skipped), -x overriding an NCCL_* value.
            (
                &parent,
                Some("ncrun1"),
                Some("s3"),
                &[
                    "NCCL_DEBUG=WARN",
                    "NCCL_SOCKET_IFNAME=eth",
                    "NCCL_HOSTID=ncrun1",
                    "NCCL_RS_JOB_SECRET=s3",
                    "FOO=from-parent",
                    "BAR=1",
                ],
            ),
            // NCCL_HOSTID and the secret of ncclrun's environment win.
            (
                &kv(&[("NCCL_HOSTID", "rack1"), ("NCCL_RS_JOB_SECRET", "given")]),
                Some("ncrun1"),
                None,
                &[
                    "NCCL_HOSTID=rack1",
                    "NCCL_RS_JOB_SECRET=given",
                    "BAR=1",
                    "NCCL_DEBUG=WARN",
                ],
            ),
            (
                &[],
                Some("h"),
                None,
                &["NCCL_HOSTID=h", "BAR=1", "NCCL_DEBUG=WARN"],
            ),
        ];
        for (parent, remote, secret, want) in table {
            let env = rank_env(parent, remote, secret, &exports, &rank);
            assert_eq!(short(&env), s(want), "{remote:?} {secret:?}");
            // The rank variables are all there, with ncclrun's values.
            for (k, v) in &rank {
                let got: Vec<_> = env.iter().filter(|(n, _)| n == k).collect();
                assert_eq!(got, [&(k.clone(), v.clone())], "{remote:?}");
            }
        }
    }
}
