//! NVRTC (the CUDA run-time compiler), opened with `dlopen` and called
//! through entry points we resolve ourselves: a missing library or symbol
//! is a [`CudaError`], never a panic (cudarc's NVRTC loader panics on
//! both).
//!
//! The library is `NCCL_RS_NVRTC_LIBRARY` when set, else the first of
//! `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so` that loads.

use super::CudaError;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// `nvrtcProgram`.
type Program = *mut c_void;

/// The NVRTC entry points we call.
#[allow(non_snake_case)]
struct Api {
    nvrtcVersion: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    nvrtcGetErrorString: unsafe extern "C" fn(c_int) -> *const c_char,
    nvrtcCreateProgram: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    nvrtcCompileProgram: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    nvrtcGetProgramLogSize: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    nvrtcGetProgramLog: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    nvrtcGetPTXSize: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    nvrtcGetPTX: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    nvrtcDestroyProgram: unsafe extern "C" fn(*mut Program) -> c_int,
    nvrtcGetNumSupportedArchs: Option<unsafe extern "C" fn(*mut c_int) -> c_int>,
    nvrtcGetSupportedArchs: Option<unsafe extern "C" fn(*mut c_int) -> c_int>,
}

/// The loaded library: its entry points, version and file name.
struct Nvrtc {
    api: Api,
    version: (i32, i32),
    name: String,
}

fn nvrtc() -> Result<&'static Nvrtc, CudaError> {
    static LIB: OnceLock<Result<Nvrtc, CudaError>> = OnceLock::new();
    LIB.get_or_init(|| {
        std::panic::catch_unwind(load)
            .unwrap_or_else(|_| Err(CudaError::Panicked("loading NVRTC".into())))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The library names tried, in order (`NCCL_RS_NVRTC_LIBRARY` of
/// [`crate::Config::global`], else the usual names).
fn candidates() -> Result<Vec<String>, CudaError> {
    let cfg = crate::Config::global().map_err(|e| CudaError::Unsupported(e.to_string()))?;
    Ok(match &cfg.cuda.nvrtc_library {
        Some(p) => vec![p.clone()],
        None => ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
            .map(String::from)
            .to_vec(),
    })
}

// The transmutes' target types are the `Api` fields they initialise.
#[allow(clippy::missing_transmute_annotations)]
fn load() -> Result<Nvrtc, CudaError> {
    let mut why = Vec::new();
    for name in candidates()? {
        let Ok(c) = CString::new(name.clone()) else {
            why.push(format!("{name}: contains a NUL byte"));
            continue;
        };
        // SAFETY: a NUL-terminated name; the handle is never closed.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated message.
            let e = unsafe { libc::dlerror() };
            why.push(if e.is_null() {
                format!("{name}: not found")
            } else {
                // SAFETY: non-NULL, NUL-terminated.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            });
            continue;
        }
        let get = |s: &str| -> Option<*mut c_void> {
            let c = CString::new(s).ok()?;
            // SAFETY: symbol lookup in a library that stays loaded.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        macro_rules! sym {
            ($n:ident) => {
                match get(stringify!($n)) {
                    // SAFETY: NVRTC exports this function with the C
                    // signature of the field (nvrtc.h).
                    Some(p) => unsafe { std::mem::transmute::<*mut c_void, _>(p) },
                    None => {
                        return Err(CudaError::Unsupported(format!(
                            "{name} has no {}",
                            stringify!($n)
                        )))
                    }
                }
            };
        }
        macro_rules! opt {
            ($n:ident) => {
                // SAFETY: as above; optional (NVRTC 11.2 and later).
                get(stringify!($n)).map(|p| unsafe { std::mem::transmute::<*mut c_void, _>(p) })
            };
        }
        let api = Api {
            nvrtcVersion: sym!(nvrtcVersion),
            nvrtcGetErrorString: sym!(nvrtcGetErrorString),
            nvrtcCreateProgram: sym!(nvrtcCreateProgram),
            nvrtcCompileProgram: sym!(nvrtcCompileProgram),
            nvrtcGetProgramLogSize: sym!(nvrtcGetProgramLogSize),
            nvrtcGetProgramLog: sym!(nvrtcGetProgramLog),
            nvrtcGetPTXSize: sym!(nvrtcGetPTXSize),
            nvrtcGetPTX: sym!(nvrtcGetPTX),
            nvrtcDestroyProgram: sym!(nvrtcDestroyProgram),
            nvrtcGetNumSupportedArchs: opt!(nvrtcGetNumSupportedArchs),
            nvrtcGetSupportedArchs: opt!(nvrtcGetSupportedArchs),
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        let rc = unsafe { (api.nvrtcVersion)(&mut major, &mut minor) };
        if rc != 0 {
            return Err(CudaError::Unsupported(format!(
                "{name}: nvrtcVersion failed ({rc})"
            )));
        }
        return Ok(Nvrtc {
            api,
            version: (major, minor),
            name,
        });
    }
    Err(CudaError::Unsupported(format!(
        "NVRTC not found ({}); set NCCL_RS_NVRTC_LIBRARY",
        why.join("; ")
    )))
}

/// NVRTC's version and library name, or why it cannot be loaded.
pub(crate) fn describe() -> Result<String, CudaError> {
    let n = nvrtc()?;
    Ok(format!(
        "NVRTC {}.{} ({})",
        n.version.0, n.version.1, n.name
    ))
}

/// The virtual architecture to compile for on a device of compute
/// capability `cc`: the newest NVRTC supports that is not newer than it
/// (PTX of an older architecture runs on newer devices).
fn pick_arch(n: &Nvrtc, cc: (i32, i32)) -> i32 {
    let want = cc.0 * 10 + cc.1;
    let (Some(num), Some(list)) = (
        n.api.nvrtcGetNumSupportedArchs,
        n.api.nvrtcGetSupportedArchs,
    ) else {
        return want;
    };
    let mut count = 0;
    // SAFETY: valid out-pointer.
    if unsafe { num(&mut count) } != 0 || !(1..=256).contains(&count) {
        return want;
    }
    let mut archs = vec![0 as c_int; count as usize];
    // SAFETY: room for `count` entries, as NVRTC reported.
    if unsafe { list(archs.as_mut_ptr()) } != 0 {
        return want;
    }
    archs
        .into_iter()
        .filter(|&a| a <= want)
        .max()
        .unwrap_or(want)
}

/// A program, destroyed on drop.
struct Prog<'a>(&'a Api, Program);

impl Drop for Prog<'_> {
    fn drop(&mut self) {
        // SAFETY: a program created by nvrtcCreateProgram, destroyed once.
        unsafe { (self.0.nvrtcDestroyProgram)(&mut self.1) };
    }
}

fn err_string(api: &Api, rc: c_int) -> String {
    // SAFETY: returns a static string (or NULL for unknown codes).
    let p = unsafe { (api.nvrtcGetErrorString)(rc) };
    if p.is_null() {
        format!("nvrtcResult {rc}")
    } else {
        // SAFETY: non-NULL static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Compiles CUDA C `source` to PTX (NUL-terminated, as
/// `cuModuleLoadData` wants it) for a device of compute capability `cc`,
/// with IEEE arithmetic (no fast math, no flush to zero, no FMA
/// contraction). Returns the PTX and the architecture compiled for.
pub(crate) fn compile_ptx(
    source: &str,
    name: &str,
    cc: (i32, i32),
) -> Result<(Vec<u8>, i32), CudaError> {
    let n = nvrtc()?;
    let api = &n.api;
    let arch = pick_arch(n, cc);
    let bad = |what: &str| CudaError::Unsupported(format!("NVRTC: {what} contains a NUL byte"));
    let src = CString::new(source).map_err(|_| bad("the source"))?;
    let cname = CString::new(name).map_err(|_| bad("the name"))?;
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: valid out-pointer and NUL-terminated strings; no headers.
    let rc = unsafe {
        (api.nvrtcCreateProgram)(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(CudaError::Unsupported(format!(
            "nvrtcCreateProgram failed: {}",
            err_string(api, rc)
        )));
    }
    let prog = Prog(api, prog);
    let opts: Vec<CString> = [
        format!("--gpu-architecture=compute_{arch}"),
        "--fmad=false".into(),
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
    ]
    .into_iter()
    .filter_map(|o| CString::new(o).ok())
    .collect();
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: a live program; `ptrs` holds `len` valid C strings.
    let rc = unsafe { (api.nvrtcCompileProgram)(prog.1, ptrs.len() as c_int, ptrs.as_ptr()) };
    if rc != 0 {
        return Err(CudaError::Unsupported(format!(
            "NVRTC failed to compile {name} for compute_{arch}: {}: {}",
            err_string(api, rc),
            log(api, prog.1)
        )));
    }
    let mut size = 0usize;
    // SAFETY: a compiled program; valid out-pointer.
    let rc = unsafe { (api.nvrtcGetPTXSize)(prog.1, &mut size) };
    if rc != 0 || size == 0 {
        return Err(CudaError::Unsupported(format!(
            "nvrtcGetPTXSize failed: {}",
            err_string(api, rc)
        )));
    }
    let mut ptx = vec![0u8; size];
    // SAFETY: `ptx` has the `size` bytes NVRTC asked for.
    let rc = unsafe { (api.nvrtcGetPTX)(prog.1, ptx.as_mut_ptr().cast()) };
    if rc != 0 {
        return Err(CudaError::Unsupported(format!(
            "nvrtcGetPTX failed: {}",
            err_string(api, rc)
        )));
    }
    if ptx.last() != Some(&0) {
        ptx.push(0);
    }
    Ok((ptx, arch))
}

/// The compile log of `prog` (trimmed), for error messages.
fn log(api: &Api, prog: Program) -> String {
    let mut size = 0usize;
    // SAFETY: a live program; valid out-pointer.
    if unsafe { (api.nvrtcGetProgramLogSize)(prog, &mut size) } != 0 || size == 0 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has the `size` bytes NVRTC asked for.
    if unsafe { (api.nvrtcGetProgramLog)(prog, buf.as_mut_ptr().cast()) } != 0 {
        return String::new();
    }
    let s = String::from_utf8_lossy(&buf);
    let s = s.trim_end_matches('\0').trim();
    s.chars().take(2000).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the real kernel source with NVRTC for sm_90, where NVRTC
    /// is installed (e.g. `NCCL_RS_NVRTC_LIBRARY=.../libnvrtc.so.13` from the
    /// `nvidia-cuda-nvrtc` wheel); skipped, saying why, elsewhere.
    #[test]
    fn kernels_compile_with_nvrtc_for_sm_90() {
        if let Err(e) = describe() {
            eprintln!("SKIPPED: {e}");
            return;
        }
        let (ptx, arch) = compile_ptx(super::super::kernels::SOURCE, "k.cu", (9, 0)).unwrap();
        assert_eq!(arch, 90);
        let ptx = String::from_utf8_lossy(&ptx);
        assert!(
            ptx.contains(".target sm_90"),
            "{}",
            &ptx[..ptx.len().min(500)]
        );
        for name in super::super::kernels::all_names() {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{name} missing from the PTX"
            );
        }
        // A source error comes back as an error with NVRTC's log.
        let e = compile_ptx("this is not CUDA", "bad.cu", (9, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.cu"), "{e}");
    }
}
