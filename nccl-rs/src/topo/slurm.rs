//! Slurm's `topology.conf` (the tree plugin): a switch tree.
//!
//! ```text
//! # comment
//! SwitchName=leaf0 Nodes=fab-h[0-3] LinkSpeed=100
//! SwitchName=leaf1 Nodes=fab-h[4-7]
//! SwitchName=spine Switches=leaf[0-1]
//! ```
//!
//! Keys are case-insensitive, `#` starts a comment, a `\` at the end of a
//! line continues it on the next. `Nodes` and `Switches` take Slurm
//! hostlists ([`expand_hostlist`]). A switch with `Nodes` is a leaf; one
//! with `Switches` is above leaves. Switches may be named before they are
//! defined, as Slurm allows.

use std::collections::HashMap;

/// The most names one hostlist expression may expand to: larger ones are
/// an error, not an allocation of unbounded size.
pub const MAX_HOSTLIST: usize = 1 << 20;

/// A `topology.conf` that cannot be used; `line` is the 1-based line its
/// statement starts on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopoFileError {
    /// A key other than `SwitchName`, `Nodes`, `Switches`, `LinkSpeed`.
    #[error(
        "line {line}: unknown key {key:?} (expected SwitchName, Nodes, Switches or LinkSpeed)"
    )]
    UnknownKey {
        /// Line number.
        line: usize,
        /// The key as written.
        key: String,
    },
    /// A word that is not `key=value`, a key given twice, a missing
    /// `SwitchName`, an empty or non-numeric value.
    #[error("line {line}: {msg}")]
    Syntax {
        /// Line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// A hostlist that does not parse (bad range, unclosed bracket, too
    /// many names).
    #[error("line {line}: bad hostlist {text:?}: {why}")]
    BadHostlist {
        /// Line number.
        line: usize,
        /// The hostlist as written.
        text: String,
        /// What is wrong.
        why: String,
    },
    /// Two statements define one switch.
    #[error("line {line}: switch {name:?} is already defined on line {first}")]
    DuplicateSwitch {
        /// Line number of the second definition.
        line: usize,
        /// The switch.
        name: String,
        /// Line of the first definition.
        first: usize,
    },
    /// A switch lists both `Nodes` and `Switches`, or neither.
    #[error("line {line}: switch {name:?} needs exactly one of Nodes and Switches")]
    NodesOrSwitches {
        /// Line number.
        line: usize,
        /// The switch.
        name: String,
    },
    /// A node listed under two leaf switches.
    #[error(
        "line {line}: node {node:?} is under leaf {first:?} (line {first_line}) and {second:?}"
    )]
    NodeUnderTwoLeaves {
        /// Line of the second leaf.
        line: usize,
        /// The node.
        node: String,
        /// The first leaf naming it.
        first: String,
        /// Its line.
        first_line: usize,
        /// The second leaf naming it.
        second: String,
    },
    /// `Switches` names a switch no statement defines.
    #[error("line {line}: switch {parent:?} lists undefined switch {child:?}")]
    UnknownSwitch {
        /// Line of the parent.
        line: usize,
        /// The parent.
        parent: String,
        /// The undefined child.
        child: String,
    },
    /// A switch listed under two parents.
    #[error("line {line}: switch {child:?} is under {first:?} and {second:?}")]
    TwoParents {
        /// Line of the second parent.
        line: usize,
        /// The child switch.
        child: String,
        /// The first parent.
        first: String,
        /// The second parent.
        second: String,
    },
    /// Switches that are (indirectly) their own parent.
    #[error("line {line}: switch {name:?} is its own ancestor (a cycle)")]
    Cycle {
        /// Line of a switch in the cycle.
        line: usize,
        /// That switch.
        name: String,
    },
}

/// One switch of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    /// `SwitchName`.
    pub name: String,
    /// `LinkSpeed`, if given (Slurm's units: unspecified).
    pub link_speed: Option<u64>,
    /// The nodes of a leaf (empty above the leaves).
    pub nodes: Vec<String>,
    /// Indices of the child switches (empty for a leaf).
    pub children: Vec<usize>,
    /// Index of the parent switch; `None` at the top.
    pub parent: Option<usize>,
    /// Level: 0 for a leaf, one more than its highest child above.
    pub level: usize,
    /// The line it is defined on.
    pub line: usize,
}

/// The switch tree of a `topology.conf`: switches in the file's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchTree {
    switches: Vec<Switch>,
    /// Node name → index of its leaf switch.
    leaf_of: HashMap<String, usize>,
}

impl SwitchTree {
    /// Parses the text of a `topology.conf`.
    pub fn parse(text: &str) -> Result<SwitchTree, TopoFileError> {
        let mut switches: Vec<Switch> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        // Per switch, its `Switches=` names (resolved once all are read).
        let mut child_names: Vec<Vec<String>> = Vec::new();
        for (line, stmt) in statements(text) {
            let (sw, children) = parse_statement(line, &stmt)?;
            if let Some(&first) = by_name.get(&sw.name) {
                return Err(TopoFileError::DuplicateSwitch {
                    line,
                    name: sw.name,
                    first: switches[first].line,
                });
            }
            by_name.insert(sw.name.clone(), switches.len());
            switches.push(sw);
            child_names.push(children);
        }
        let mut leaf_of: HashMap<String, usize> = HashMap::new();
        for (i, sw) in switches.iter().enumerate() {
            for node in &sw.nodes {
                if let Some(&first) = leaf_of.get(node) {
                    if first != i {
                        return Err(TopoFileError::NodeUnderTwoLeaves {
                            line: sw.line,
                            node: node.clone(),
                            first: switches[first].name.clone(),
                            first_line: switches[first].line,
                            second: sw.name.clone(),
                        });
                    }
                }
                leaf_of.insert(node.clone(), i);
            }
        }
        for (p, names) in child_names.iter().enumerate() {
            for child in names {
                let Some(&c) = by_name.get(child) else {
                    return Err(TopoFileError::UnknownSwitch {
                        line: switches[p].line,
                        parent: switches[p].name.clone(),
                        child: child.clone(),
                    });
                };
                match switches[c].parent {
                    Some(q) if q == p => continue,
                    Some(q) => {
                        return Err(TopoFileError::TwoParents {
                            line: switches[p].line,
                            child: child.clone(),
                            first: switches[q].name.clone(),
                            second: switches[p].name.clone(),
                        })
                    }
                    None => {}
                }
                switches[c].parent = Some(p);
                switches[p].children.push(c);
            }
        }
        // With one parent per switch, a walk up that takes more steps than
        // there are switches is in a cycle.
        for (i, sw) in switches.iter().enumerate() {
            let mut at = sw.parent;
            let mut steps = 0;
            while let Some(p) = at {
                steps += 1;
                if p == i || steps > switches.len() {
                    return Err(TopoFileError::Cycle {
                        line: sw.line,
                        name: sw.name.clone(),
                    });
                }
                at = switches[p].parent;
            }
        }
        // Levels: a leaf is 0, a parent one above its highest child. In a
        // tree, at most `len` passes settle every level.
        for _ in 0..switches.len() {
            let mut changed = false;
            for i in 0..switches.len() {
                let level = switches[i]
                    .children
                    .iter()
                    .map(|&c| switches[c].level + 1)
                    .max()
                    .unwrap_or(0);
                if level != switches[i].level {
                    switches[i].level = level;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        Ok(SwitchTree { switches, leaf_of })
    }

    /// Reads and parses the file at `path`; an error names the file (and
    /// the line).
    pub fn load(path: &std::path::Path) -> Result<SwitchTree, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("topology file {}: {e}", path.display()))?;
        SwitchTree::parse(&text).map_err(|e| format!("topology file {}: {e}", path.display()))
    }

    /// Every switch, in the file's order.
    pub fn switches(&self) -> &[Switch] {
        &self.switches
    }

    /// The index of the leaf switch `node` is under.
    pub fn leaf_of(&self, node: &str) -> Option<usize> {
        self.leaf_of.get(node).copied()
    }

    /// The switches from `node`'s leaf up to the top, as indices.
    pub fn path(&self, node: &str) -> Option<Vec<usize>> {
        Some(self.path_from(self.leaf_of(node)?))
    }

    /// The switches from switch `s` up to the top (`s` first).
    pub fn path_from(&self, s: usize) -> Vec<usize> {
        let mut path = vec![s];
        // The tree has no cycle (checked by `parse`): this ends.
        while let Some(p) = path.last().and_then(|&s| self.switches[s].parent) {
            path.push(p);
        }
        path
    }

    /// The names of the switches from `node`'s leaf up to the top.
    pub fn path_names(&self, node: &str) -> Option<Vec<&str>> {
        Some(
            self.path(node)?
                .into_iter()
                .map(|s| self.switches[s].name.as_str())
                .collect(),
        )
    }
}

/// The statements of `text` with the line each starts on: comments cut,
/// continued lines joined, blank statements left out.
fn statements(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        let body = raw.split('#').next().unwrap_or("");
        if cur.is_empty() {
            start = i + 1;
        }
        let (body, more) = match body.trim_end().strip_suffix('\\') {
            Some(b) => (b, true),
            None => (body, false),
        };
        cur.push(' ');
        cur.push_str(body);
        if !more {
            if !cur.trim().is_empty() {
                out.push((start, std::mem::take(&mut cur)));
            }
            cur.clear();
        }
    }
    if !cur.trim().is_empty() {
        out.push((start, cur));
    }
    out
}

/// One statement: its switch and the names of its child switches.
fn parse_statement(line: usize, stmt: &str) -> Result<(Switch, Vec<String>), TopoFileError> {
    let syntax = |msg: String| TopoFileError::Syntax { line, msg };
    let (mut name, mut nodes, mut switches, mut speed) = (None, None, None, None);
    for word in stmt.split_whitespace() {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| syntax(format!("{word:?} is not key=value")))?;
        if value.is_empty() {
            return Err(syntax(format!("{key} has no value")));
        }
        let slot = match key.to_ascii_lowercase().as_str() {
            "switchname" => &mut name,
            "nodes" => &mut nodes,
            "switches" => &mut switches,
            "linkspeed" => &mut speed,
            _ => {
                return Err(TopoFileError::UnknownKey {
                    line,
                    key: key.to_string(),
                })
            }
        };
        if slot.replace(value.to_string()).is_some() {
            return Err(syntax(format!("{key} given twice")));
        }
    }
    let Some(name) = name else {
        return Err(syntax("no SwitchName".into()));
    };
    let list = |text: &str| {
        expand_hostlist(text).map_err(|why| TopoFileError::BadHostlist {
            line,
            text: text.to_string(),
            why,
        })
    };
    let (nodes, children) = match (nodes, switches) {
        (Some(n), None) => (list(&n)?, Vec::new()),
        (None, Some(s)) => (Vec::new(), list(&s)?),
        _ => return Err(TopoFileError::NodesOrSwitches { line, name }),
    };
    let link_speed = match speed {
        None => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| syntax(format!("LinkSpeed={v:?} is not a non-negative integer")))?,
        ),
    };
    let sw = Switch {
        name,
        link_speed,
        nodes,
        children: Vec::new(),
        parent: None,
        level: 0,
        line,
    };
    Ok((sw, children))
}

/// Expands a Slurm hostlist: comma-separated entries, each a name with
/// bracket groups of ranges (`fab-h[0-3,5]`, zero-padded `n[01-10]`, more
/// than one group: `r[1-2]n[1-2]` → `r1n1 r1n2 r2n1 r2n2`). A range's
/// digits keep the width of its first number when that has a leading zero.
/// Errors: unbalanced or nested brackets, a range whose end is below its
/// start, non-digits in a range, an empty name, more than [`MAX_HOSTLIST`]
/// names.
pub fn expand_hostlist(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for entry in split_top(text)? {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err("an empty name".into());
        }
        let mut names = vec![String::new()];
        let mut rest = entry;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    if rest.contains(']') {
                        return Err(format!("unmatched ']' in {entry:?}"));
                    }
                    names.iter_mut().for_each(|n| n.push_str(rest));
                    rest = "";
                }
                Some(open) => {
                    let (lit, tail) = rest.split_at(open);
                    if lit.contains(']') {
                        return Err(format!("unmatched ']' in {entry:?}"));
                    }
                    let close = tail
                        .find(']')
                        .ok_or_else(|| format!("unclosed '[' in {entry:?}"))?;
                    let group = &tail[1..close];
                    if group.contains('[') {
                        return Err(format!("nested '[' in {entry:?}"));
                    }
                    let items = expand_group(group)?;
                    let total = names.len().saturating_mul(items.len());
                    if out.len().saturating_add(total) > MAX_HOSTLIST {
                        return Err(format!("more than {MAX_HOSTLIST} names"));
                    }
                    names = names
                        .iter()
                        .flat_map(|n| items.iter().map(move |i| format!("{n}{lit}{i}")))
                        .collect();
                    rest = &tail[close + 1..];
                }
            }
        }
        if out.len() + names.len() > MAX_HOSTLIST {
            return Err(format!("more than {MAX_HOSTLIST} names"));
        }
        out.extend(names);
    }
    Ok(out)
}

/// Splits at the commas outside brackets.
fn split_top(text: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut out) = (0usize, 0, Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unmatched ']' in {text:?}"))?
            }
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unclosed '[' in {text:?}"));
    }
    out.push(&text[start..]);
    Ok(out)
}

/// The numbers of one bracket group (`0-3,5`, `01-10`), as text.
fn expand_group(group: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in group.split(',') {
        let item = item.trim();
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!(
                "range {item:?} is not N or N-M with decimal digits"
            ));
        }
        let (a, b): (u64, u64) = (
            lo.parse().map_err(|_| format!("range {item:?}"))?,
            hi.parse().map_err(|_| format!("range {item:?}"))?,
        );
        if b < a {
            return Err(format!("range {item:?} ends below its start"));
        }
        if (b - a) as usize >= MAX_HOSTLIST - out.len().min(MAX_HOSTLIST) {
            return Err(format!("more than {MAX_HOSTLIST} names"));
        }
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists_expand() {
        let cases: &[(&str, &[&str])] = &[
            ("h0", &["h0"]),
            (
                "fab-h[0-3,5]",
                &["fab-h0", "fab-h1", "fab-h2", "fab-h3", "fab-h5"],
            ),
            ("n[01-03]", &["n01", "n02", "n03"]),
            ("n[08-10]", &["n08", "n09", "n10"]),
            ("n[8-10]", &["n8", "n9", "n10"]),
            ("n[0]", &["n0"]),
            ("n[007]", &["n007"]),
            ("a,b[1-2],c", &["a", "b1", "b2", "c"]),
            ("r[1-2]n[1-2]", &["r1n1", "r1n2", "r2n1", "r2n2"]),
            ("[1-2]x", &["1x", "2x"]),
            ("pre[3]-post", &["pre3-post"]),
            ("n[1, 3]", &["n1", "n3"]),
        ];
        for (text, want) in cases {
            let got = expand_hostlist(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(got, *want, "{text}");
        }
    }

    #[test]
    fn bad_hostlists_are_errors() {
        for text in [
            "",
            "a,,b",
            "n[",
            "n]",
            "n[1-",
            "n[3-1]",
            "n[a-b]",
            "n[1-2",
            "n[[1]]",
            "n[]",
            "n[-1]",
            "n[1-2-3]",
            "n[0-99999999999999]",
            "n[1]]",
            "n[0-999]x[0-9999]",
        ] {
            assert!(expand_hostlist(text).is_err(), "{text:?} should fail");
        }
    }

    const TREE: &str = "\
# a two-level tree
SwitchName=leaf0 Nodes=fab-h[0-1] LinkSpeed=100
switchname=leaf1 nodes=fab-h[2-3] # trailing comment
SwitchName=spine \\
    Switches=leaf[0-1]
";

    #[test]
    fn a_tree_parses() {
        let t = SwitchTree::parse(TREE).unwrap();
        let names: Vec<(&str, usize, usize, Option<u64>)> = t
            .switches()
            .iter()
            .map(|s| (s.name.as_str(), s.level, s.line, s.link_speed))
            .collect();
        assert_eq!(
            names,
            [
                ("leaf0", 0, 2, Some(100)),
                ("leaf1", 0, 3, None),
                ("spine", 1, 4, None)
            ]
        );
        assert_eq!(t.leaf_of("fab-h3"), Some(1));
        assert_eq!(t.leaf_of("fab-h4"), None);
        assert_eq!(t.path_names("fab-h0"), Some(vec!["leaf0", "spine"]));
        assert_eq!(t.path_names("fab-h2"), Some(vec!["leaf1", "spine"]));
        assert_eq!(t.switches()[2].children, [0, 1]);
        assert_eq!(t.switches()[0].parent, Some(2));
    }

    #[test]
    fn parents_may_come_first_and_levels_follow_the_highest_child() {
        let text = "SwitchName=top Switches=mid,l2\n\
                    SwitchName=mid Switches=l1\n\
                    SwitchName=l1 Nodes=a\n\
                    SwitchName=l2 Nodes=b\n";
        let t = SwitchTree::parse(text).unwrap();
        let levels: Vec<usize> = t.switches().iter().map(|s| s.level).collect();
        assert_eq!(levels, [2, 1, 0, 0]);
        assert_eq!(t.path_names("a"), Some(vec!["l1", "mid", "top"]));
        assert_eq!(t.path_names("b"), Some(vec!["l2", "top"]));
    }

    #[test]
    fn bad_files_are_typed_errors_with_their_line() {
        use TopoFileError as E;
        let cases: &[(&str, E)] = &[
            (
                "\nSwitchName=s Nodes=a Speed=1\n",
                E::UnknownKey {
                    line: 2,
                    key: "Speed".into(),
                },
            ),
            (
                "SwitchName=s Nodes=n[2-1]\n",
                E::BadHostlist {
                    line: 1,
                    text: "n[2-1]".into(),
                    why: "range \"2-1\" ends below its start".into(),
                },
            ),
            (
                "SwitchName=a Nodes=h[0-2]\n#\nSwitchName=b Nodes=h2\n",
                E::NodeUnderTwoLeaves {
                    line: 3,
                    node: "h2".into(),
                    first: "a".into(),
                    first_line: 1,
                    second: "b".into(),
                },
            ),
            (
                "SwitchName=a Switches=b\nSwitchName=b Switches=a\n",
                E::Cycle {
                    line: 1,
                    name: "a".into(),
                },
            ),
            (
                "SwitchName=a Switches=a\n",
                E::Cycle {
                    line: 1,
                    name: "a".into(),
                },
            ),
            (
                "SwitchName=l Nodes=x\nSwitchName=l Nodes=y\n",
                E::DuplicateSwitch {
                    line: 2,
                    name: "l".into(),
                    first: 1,
                },
            ),
            (
                "SwitchName=top Switches=nowhere\n",
                E::UnknownSwitch {
                    line: 1,
                    parent: "top".into(),
                    child: "nowhere".into(),
                },
            ),
            (
                "SwitchName=l Nodes=x\nSwitchName=p Switches=l\nSwitchName=q Switches=l\n",
                E::TwoParents {
                    line: 3,
                    child: "l".into(),
                    first: "p".into(),
                    second: "q".into(),
                },
            ),
            (
                "SwitchName=l Nodes=x Switches=y\n",
                E::NodesOrSwitches {
                    line: 1,
                    name: "l".into(),
                },
            ),
            (
                "SwitchName=l\n",
                E::NodesOrSwitches {
                    line: 1,
                    name: "l".into(),
                },
            ),
            (
                "Nodes=x\n",
                E::Syntax {
                    line: 1,
                    msg: "no SwitchName".into(),
                },
            ),
            (
                "SwitchName=l Nodes=x LinkSpeed=fast\n",
                E::Syntax {
                    line: 1,
                    msg: "LinkSpeed=\"fast\" is not a non-negative integer".into(),
                },
            ),
            (
                "SwitchName=l Nodes=x nodes=y\n",
                E::Syntax {
                    line: 1,
                    msg: "nodes given twice".into(),
                },
            ),
            (
                "SwitchName=l \\\n  Nodes\n",
                E::Syntax {
                    line: 1,
                    msg: "\"Nodes\" is not key=value".into(),
                },
            ),
            (
                "SwitchName= Nodes=x\n",
                E::Syntax {
                    line: 1,
                    msg: "SwitchName has no value".into(),
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(SwitchTree::parse(text).as_ref(), Err(want), "{text:?}");
        }
    }

    #[test]
    fn a_loaded_files_error_names_the_file_and_line() {
        let dir = std::env::temp_dir().join(format!("nccl-rs-topo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("topology.conf");
        std::fs::write(&path, "SwitchName=a Nodes=x\nSwitchName=b Nodez=y\n").unwrap();
        let e = SwitchTree::load(&path).unwrap_err();
        assert_eq!(
            e,
            format!(
                "topology file {}: line 2: unknown key \"Nodez\" (expected SwitchName, Nodes, Switches or LinkSpeed)",
                path.display()
            )
        );
        let missing = SwitchTree::load(&dir.join("absent")).unwrap_err();
        assert!(
            missing.contains("absent") && missing.contains("No such file"),
            "{missing}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn arbitrary_input_never_panics() {
        let mut rng = crate::testing::Rng(0x9e37_79b9_7f4a_7c15);
        // Bytes drawn mostly from the file's own alphabet, so that many
        // inputs get deep into the parser.
        const ALPHABET: &[u8] = b"SwitchName=Nodes=Switches=LinkSpeed=[]-,0123456789 \\\n#ab";
        for _ in 0..20_000 {
            let len = (rng.next_u64() % 80) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| match rng.next_u64() % 8 {
                    0 => rng.next_u64() as u8,
                    _ => ALPHABET[(rng.next_u64() as usize) % ALPHABET.len()],
                })
                .collect();
            let text = String::from_utf8_lossy(&bytes);
            let _ = SwitchTree::parse(&text);
            let _ = expand_hostlist(&text);
        }
    }
}
