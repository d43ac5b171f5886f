//! The few libibverbs types and functions this crate uses, loaded at run
//! time with `dlopen("libibverbs.so.1")`.
//!
//! # Why our own binding
//! NCCL loads libibverbs with `dlopen` (its `ibvwrap.cc` / `ibvsymbols.cc`),
//! so one NCCL build runs on machines with and without rdma-core and falls
//! back to sockets. The Rust crates that bind libibverbs do not allow that:
//! `rdma-sys` and `ibverbs-sys` (under `ibverbs`) emit
//! `cargo:rustc-link-lib=ibverbs`, so the binary gets a `DT_NEEDED` entry for
//! `libibverbs.so.1` and does not even start where rdma-core is missing (and
//! `ibverbs-sys` builds a vendored rdma-core with cmake at build time). We
//! need about fifteen functions and a dozen structs, so this module declares
//! them by hand from rdma-core's `infiniband/verbs.h` (ABI `IBVERBS_1.1`,
//! stable since rdma-core v13) and resolves the symbols with `libloading`.
//! The structs only declare the prefix of fields we touch where the C struct
//! is longer and is never allocated by us (`ibv_context`, `ibv_qp`,
//! `ibv_cq`, `ibv_pd`); structs we allocate and pass in are complete. The
//! unit tests pin every size and offset we rely on to the values printed by
//! a C program compiled against rdma-core 44's header (x86_64 and aarch64
//! share them: LP64, natural alignment).
//!
//! # Inline functions
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are `static inline` in
//! `verbs.h`: they call through the provider's function table in
//! `context->ops`, found from the QP's or CQ's `context` pointer. There are
//! no symbols for them, so [`post_send`], [`post_recv`] and [`poll_cq`] do
//! the same through [`ibv_context_ops`].
//!
//! `ibv_query_port` is a macro in newer headers that prefers the extended
//! `verbs_context` op and otherwise calls the exported `ibv_query_port`
//! symbol with a zeroed `struct ibv_port_attr` cast to the older
//! `_compat_ibv_port_attr`. We call the exported symbol the same way (as NCCL
//! does), with a zeroed buffer larger than any version of the struct.
#![allow(non_camel_case_types, missing_docs)]

mod consts;
mod inline_ops;
mod loader;
mod types;

pub(crate) use consts::*;
pub(crate) use inline_ops::{poll_cq, post_recv, post_send};
pub(crate) use loader::{Lib, LoadError, PortAttrBuf, LIBIBVERBS};
pub(crate) use types::*;

#[cfg(test)]
mod tests;
