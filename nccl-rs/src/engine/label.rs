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
            OpLabel::Coll {
                coll, dtype, op, ..
            } => {
                let op = if coll.reduces() {
                    format!(", {op}")
                } else {
                    String::new()
                };
                let name = coll.name();
                match coll {
                    Coll::AllReduce { count } | Coll::AllToAll { count } => {
                        format!("{name}(count={count}, {dtype}{op})")
                    }
                    Coll::ReduceScatter { recv_count: count }
                    | Coll::AllGather { send_count: count } => {
                        format!("{name}(count={count}, {dtype}{op})")
                    }
                    Coll::Broadcast { count, root }
                    | Coll::Reduce { count, root }
                    | Coll::Gather { count, root }
                    | Coll::Scatter { count, root } => {
                        format!("{name}(count={count}, {dtype}{op}, root={root})")
                    }
                }
            }
            OpLabel::Group { ops } => format!("send/recv group of {ops} ops"),
            #[cfg(test)]
            OpLabel::Test => "test".into(),
        }
    }

    /// A 31-bit fingerprint of the call and its sequence number, used as
    /// the transport tag: six words mixed by multiply-rotate (a few
    /// nanoseconds; `cargo bench -p nccl-rs --bench fingerprint`).
    pub(crate) fn fingerprint(&self) -> u32 {
        let OpLabel::Coll {
            coll,
            dtype,
            op,
            seq,
        } = *self
        else {
            return 0;
        };
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
        let words = [
            seq,
            kind,
            count as u64,
            root as u64,
            dtype as u64,
            op as u64,
        ];
        let mut h: u64 = 0x243f_6a88_85a3_08d3;
        for w in words {
            h = (h.rotate_left(23) ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        ((h >> 33) as u32) & 0x7fff_ffff
    }
}

/// The fingerprint of an all-reduce, for the benchmark.
pub(crate) fn fingerprint_all_reduce(seq: u64, count: usize) -> u32 {
    OpLabel::Coll {
        coll: Coll::AllReduce { count },
        dtype: DataType::Float32,
        op: RedOp::Sum,
        seq,
    }
    .fingerprint()
}

impl fmt::Display for OpLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpLabel::Coll { seq, .. } => write!(f, "{} as operation #{seq}", self.call()),
            _ => f.write_str(&self.call()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_differ_by_every_field() {
        let base = OpLabel::Coll {
            coll: Coll::AllReduce { count: 1024 },
            dtype: DataType::Float32,
            op: RedOp::Sum,
            seq: 57,
        };
        let variants = [
            OpLabel::Coll {
                coll: Coll::AllReduce { count: 1023 },
                dtype: DataType::Float32,
                op: RedOp::Sum,
                seq: 57,
            },
            OpLabel::Coll {
                coll: Coll::AllReduce { count: 1024 },
                dtype: DataType::Float16,
                op: RedOp::Sum,
                seq: 57,
            },
            OpLabel::Coll {
                coll: Coll::AllReduce { count: 1024 },
                dtype: DataType::Float32,
                op: RedOp::Max,
                seq: 57,
            },
            OpLabel::Coll {
                coll: Coll::AllReduce { count: 1024 },
                dtype: DataType::Float32,
                op: RedOp::Sum,
                seq: 58,
            },
            OpLabel::Coll {
                coll: Coll::Broadcast {
                    count: 1024,
                    root: 0,
                },
                dtype: DataType::Float32,
                op: RedOp::Sum,
                seq: 57,
            },
            OpLabel::Coll {
                coll: Coll::Broadcast {
                    count: 1024,
                    root: 1,
                },
                dtype: DataType::Float32,
                op: RedOp::Sum,
                seq: 57,
            },
        ];
        for v in variants {
            assert_ne!(v.fingerprint(), base.fingerprint(), "{v}");
            assert_eq!(v.fingerprint() & 0x8000_0000, 0);
        }
        assert_eq!(
            base.to_string(),
            "all_reduce(count=1024, float, sum) as operation #57"
        );
    }
}
