//! `NCCL_TOPO_DUMP_FILE`: the detected topology as XML of our own (NCCL
//! writes XML too, of its own schema):
//!
//! ```xml
//! <system version="1" ranks="2" hosts="2" rails="1" leaves="1">
//!   <switch name="spine" level="1">
//!     <switch name="leaf0" level="0">
//!       <host name="h0" id="boot/h0" leaf="0">
//!         <nic name="eth0" addr="10.0.0.1" speed="25000" rail="0"/>
//!         <rank rank="0" local="0"/>
//!       </host>
//!     ...
//! ```
//!
//! Switches nest from the top down to the leaves, hosts sit in their leaf;
//! hosts on a pseudo-leaf (not named in `topology.conf`) sit in `<system>`.
//! A switch carries `speed` (its `LinkSpeed`) and `oversub` (the ratio of
//! its level) when known.

use super::fabric::Fabric;
use std::fmt::Write;

/// Version of the dump's format.
pub const DUMP_VERSION: u32 = 1;

/// One switch of the rendered forest.
struct Node {
    name: String,
    level: usize,
    speed: Option<u64>,
    children: Vec<usize>,
    leaf: Option<usize>,
}

/// The fabric as XML, one element per line, two spaces per level.
pub fn to_xml(f: &Fabric) -> String {
    let mut nodes: Vec<Node> = Vec::new();
    let mut roots: Vec<usize> = Vec::new();
    for (l, leaf) in f.leaves().iter().enumerate().filter(|(_, l)| !l.pseudo) {
        let mut at: Option<usize> = None;
        for sw in leaf.path.iter().rev() {
            let siblings = match at {
                None => &roots,
                Some(p) => &nodes[p].children,
            };
            let found = siblings.iter().copied().find(|&n| nodes[n].name == sw.name);
            let n = match found {
                Some(n) => n,
                None => {
                    nodes.push(Node {
                        name: sw.name.clone(),
                        level: sw.level,
                        speed: sw.link_speed,
                        children: Vec::new(),
                        leaf: None,
                    });
                    let n = nodes.len() - 1;
                    match at {
                        None => roots.push(n),
                        Some(p) => nodes[p].children.push(n),
                    }
                    n
                }
            };
            at = Some(n);
        }
        if let Some(n) = at {
            nodes[n].leaf = Some(l);
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<system version=\"{DUMP_VERSION}\" ranks=\"{}\" hosts=\"{}\" rails=\"{}\" leaves=\"{}\">",
        f.nranks(),
        f.nhosts(),
        f.rails(),
        f.nleaves()
    );
    for &r in &roots {
        switch(f, &nodes, r, 1, &mut out);
    }
    for l in (0..f.nleaves()).filter(|&l| f.leaves()[l].pseudo) {
        hosts_of_leaf(f, l, 1, &mut out);
    }
    out.push_str("</system>\n");
    out
}

fn indent(out: &mut String, depth: usize) {
    (0..depth).for_each(|_| out.push_str("  "));
}

fn switch(f: &Fabric, nodes: &[Node], n: usize, depth: usize, out: &mut String) {
    let node = &nodes[n];
    indent(out, depth);
    let _ = write!(
        out,
        "<switch name=\"{}\" level=\"{}\"",
        escape(&node.name),
        node.level
    );
    if let Some(s) = node.speed {
        let _ = write!(out, " speed=\"{s}\"");
    }
    if let Some(o) = f.oversubscription(node.level) {
        let _ = write!(out, " oversub=\"{o}\"");
    }
    out.push_str(">\n");
    for &c in &node.children {
        switch(f, nodes, c, depth + 1, out);
    }
    if let Some(l) = node.leaf {
        hosts_of_leaf(f, l, depth + 1, out);
    }
    indent(out, depth);
    out.push_str("</switch>\n");
}

fn hosts_of_leaf(f: &Fabric, leaf: usize, depth: usize, out: &mut String) {
    for (h, host) in f
        .hosts()
        .iter()
        .enumerate()
        .filter(|(h, _)| f.leaf_of_host(*h) == leaf)
    {
        indent(out, depth);
        let _ = writeln!(
            out,
            "<host name=\"{}\" id=\"{}\" leaf=\"{leaf}\">",
            escape(&host.name),
            escape(&String::from_utf8_lossy(&host.id))
        );
        for nic in &host.nics {
            indent(out, depth + 1);
            let _ = writeln!(
                out,
                "<nic name=\"{}\" addr=\"{}\" speed=\"{}\" rail=\"{}\"/>",
                escape(&nic.name),
                nic.addr,
                nic.speed_mbps,
                nic.rail
            );
        }
        for &r in f.local_ranks(h) {
            indent(out, depth + 1);
            let _ = writeln!(out, "<rank rank=\"{r}\" local=\"{}\"/>", f.local_rank(r));
        }
        indent(out, depth);
        out.push_str("</host>\n");
    }
}

/// Text as an XML attribute value.
fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if c.is_control() => {
                let _ = write!(o, "&#x{:x};", c as u32);
            }
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::super::fabric::tests::rec;
    use super::super::slurm::SwitchTree;
    use super::*;

    #[test]
    fn a_small_fabric_dumps_exactly() {
        let t = SwitchTree::parse(
            "SwitchName=l0 Nodes=h0\nSwitchName=l1 Nodes=h1\nSwitchName=spine Switches=l[0-1] LinkSpeed=400\n",
        )
        .unwrap();
        let mut recs = vec![rec("h0", 1), rec("h1", 2), rec("h0", 1), rec("x<&\"", 0)];
        recs[1].nics[1].speed_mbps = 0;
        let f = Fabric::build(&recs, Some(&t), &[2.0]);
        let want = "\
<system version=\"1\" ranks=\"4\" hosts=\"3\" rails=\"0\" leaves=\"3\">
  <switch name=\"spine\" level=\"1\" speed=\"400\">
    <switch name=\"l0\" level=\"0\" oversub=\"2\">
      <host name=\"h0\" id=\"boot/h0\" leaf=\"0\">
        <nic name=\"eth0\" addr=\"10.78.0.1\" speed=\"25000\" rail=\"0\"/>
        <rank rank=\"0\" local=\"0\"/>
        <rank rank=\"2\" local=\"1\"/>
      </host>
    </switch>
    <switch name=\"l1\" level=\"0\" oversub=\"2\">
      <host name=\"h1\" id=\"boot/h1\" leaf=\"1\">
        <nic name=\"eth0\" addr=\"10.78.0.1\" speed=\"25000\" rail=\"0\"/>
        <nic name=\"eth1\" addr=\"10.78.0.2\" speed=\"0\" rail=\"1\"/>
        <rank rank=\"1\" local=\"0\"/>
      </host>
    </switch>
  </switch>
  <host name=\"x&lt;&amp;&quot;\" id=\"boot/x&lt;&amp;&quot;\" leaf=\"2\">
    <rank rank=\"3\" local=\"0\"/>
  </host>
</system>
";
        assert_eq!(to_xml(&f), want);
    }

    #[test]
    fn without_a_file_hosts_sit_in_the_system() {
        let f = Fabric::build(&[rec("a", 0)], None, &[]);
        let want = "\
<system version=\"1\" ranks=\"1\" hosts=\"1\" rails=\"0\" leaves=\"1\">
  <host name=\"a\" id=\"boot/a\" leaf=\"0\">
    <rank rank=\"0\" local=\"0\"/>
  </host>
</system>
";
        assert_eq!(to_xml(&f), want);
        assert_eq!(escape("a\tb'"), "a&#x9;b&apos;");
    }
}
