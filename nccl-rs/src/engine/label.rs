//! Names of operations for errors and mismatch reports, built only when
//! needed (formatting a string per call would cost more than a small
//! all-reduce).

use crate::datatype::{DataType, RedOp};
use crate::plan::Coll;
use std::fmt;

/// What one engine run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpLabel {
    /// Collective number `seq` of the communicator.
    Coll {
        /// Shape.
        coll: Coll,
        /// Element type.
        dtype: DataType,
        /// Reduction.
        op: RedOp,
        /// Sequence number.
        seq: u64,
    },
    /// A send/recv group of `ops` operations.
    Group {
        /// Operations in the group.
        ops: usize,
    },
    /// A test run.
    #[cfg(test)]
    Test,
}

impl OpLabel {
    /// The call as the user made it, e.g. `all_reduce(count=4, float, sum)`.
    pub(crate) fn call(&self) -> String {
        match *self {
            OpLabel::Coll { coll, dtype, op, .. } => {
                let reduces = matches!(coll, Coll::AllReduce { .. } | Coll::ReduceScatter { .. } | Coll::Reduce { .. });
                let op = if reduces { format!(", {op}") } else { String::new() };
                let name = coll.name();
                match coll {
                    Coll::AllReduce { count } | Coll::AllToAll { count } => format!("{name}(count={count}, {dtype}{op})"),
                    Coll::ReduceScatter { recv_count: count } | Coll::AllGather { send_count: count } => {
                        format!("{name}(count={count}, {dtype}{op})")
                    }
                    Coll::Broadcast { count, root }
                    | Coll::Reduce { count, root }
                    | Coll::Gather { count, root }
                    | Coll::Scatter { count, root } => format!("{name}(count={count}, {dtype}{op}, root={root})"),
                }
            }
            OpLabel::Group { ops } => format!("send/recv group of {ops} ops"),
            #[cfg(test)]
            OpLabel::Test => "test".into(),
        }
    }

    /// A 31-bit fingerprint of the call and its sequence number (FNV-1a
    /// over the fields), used as the transport tag.
    pub(crate) fn fingerprint(&self) -> u32 {
        let OpLabel::Coll { coll, dtype, op, seq } = *self else { return 0 };
        let (kind, count, root) = match coll {
            Coll::AllReduce { count } => (1, count, 0),
            Coll::ReduceScatter { recv_count } => (2, recv_count, 0),
            Coll::AllGather { send_count } => (3, send_count, 0),
            Coll::Broadcast { count, root } => (4, count, root),
            Coll::Reduce { count, root } => (5, count, root),
            Coll::AllToAll { count } => (6, count, 0),
            Coll::Gather { count, root } => (7, count, root),
            Coll::Scatter { count, root } => (8, count, root),
        };
        let words = [seq, kind, count as u64, root as u64, dtype as u64, op as u64];
        let mut h: u32 = 0x811c_9dc5;
        for w in words {
            for b in w.to_le_bytes() {
                h ^= u32::from(b);
                h = h.wrapping_mul(0x0100_0193);
            }
        }
        h & 0x7fff_ffff
    }
}

impl fmt::Display for OpLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpLabel::Coll { seq, .. } => write!(f, "{} as operation #{seq}", self.call()),
            _ => f.write_str(&self.call()),
        }
    }
}
