//! The stager's settings ([`StagingOptions`], from `NCCL_RS_CUDA_STAGING_CHUNK`
//! and `NCCL_RS_CUDA_PIPELINE`) and the C API's stream handle ([`Stream`]).

use crate::error::Result;
use cudarc::driver::sys::CUstream;

/// A CUDA stream as the C API passes it (`cudaStream_t` / `CUstream`): 0
/// is the legacy default stream, 1 `cudaStreamLegacy`, 2
/// `cudaStreamPerThread`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stream(pub usize);

impl Stream {
    /// The legacy default stream.
    pub const DEFAULT: Stream = Stream(0);

    /// From a raw `CUstream`.
    pub fn from_raw(s: CUstream) -> Stream {
        Stream(s as usize)
    }

    /// A stream handle, not one of the special values 0, 1, 2.
    pub fn is_handle(self) -> bool {
        self.0 > 2
    }

    /// The handle work is enqueued on. `cudaStreamPerThread` is the
    /// calling thread's stream, and calls may run on another thread
    /// (group and worker threads), so it becomes the legacy default
    /// stream, which is ordered with every blocking stream of the context,
    /// the per-thread ones included.
    pub(crate) fn effective(self) -> CUstream {
        match self.0 {
            2 => std::ptr::null_mut(),
            s => s as CUstream,
        }
    }
}

/// Tuning of the staging engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagingOptions {
    /// Bytes staged per pipeline step (`NCCL_RS_CUDA_STAGING_CHUNK`, default
    /// 2 MiB, at least 4 KiB). Every rank must use the same value.
    pub chunk_bytes: usize,
    /// Split large buffers into chunks (`NCCL_RS_CUDA_PIPELINE`, default on).
    pub pipeline: bool,
}

impl Default for StagingOptions {
    fn default() -> Self {
        StagingOptions {
            chunk_bytes: 2 << 20,
            pipeline: true,
        }
    }
}

impl StagingOptions {
    /// From the process environment ([`crate::Config::global`]).
    pub fn from_env() -> Result<StagingOptions> {
        Ok(Self::from_config(crate::Config::global()?))
    }

    /// From `NCCL_RS_CUDA_STAGING_CHUNK` and `NCCL_RS_CUDA_PIPELINE` of `c`.
    pub fn from_config(c: &crate::Config) -> StagingOptions {
        StagingOptions {
            chunk_bytes: c.cuda.staging_chunk_bytes,
            pipeline: c.cuda.pipeline,
        }
    }

    /// Through `get`, as [`crate::Config::from_lookup`] reads it (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<StagingOptions> {
        Ok(Self::from_config(&crate::Config::from_lookup(get)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let get = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            StagingOptions::from_lookup(get(&[])).unwrap(),
            StagingOptions::default()
        );
        let o = StagingOptions::from_lookup(get(&[
            ("NCCL_RS_CUDA_STAGING_CHUNK", "64K"),
            ("NCCL_RS_CUDA_PIPELINE", "0"),
        ]))
        .unwrap();
        assert_eq!((o.chunk_bytes, o.pipeline), (65536, false));
        assert_eq!(
            StagingOptions::from_lookup(get(&[("NCCL_RS_CUDA_STAGING_CHUNK", "8388608")]))
                .unwrap()
                .chunk_bytes,
            8 << 20
        );
        for bad in ["12", "x", "2T", "4G"] {
            let pairs: &'static [(&str, &str)] =
                Box::leak(Box::new([("NCCL_RS_CUDA_STAGING_CHUNK", bad)]));
            assert!(StagingOptions::from_lookup(get(pairs)).is_err(), "{bad}");
        }
        assert!(StagingOptions::from_lookup(get(&[("NCCL_RS_CUDA_PIPELINE", "yes")])).is_err());
    }

    #[test]
    fn special_streams() {
        assert!(!Stream(0).is_handle() && !Stream(1).is_handle() && !Stream(2).is_handle());
        assert!(Stream(0x1000).is_handle());
        assert!(Stream(2).effective().is_null());
        assert_eq!(Stream(1).effective() as usize, 1);
    }
}
