//! The CUDA backend: loads the driver and NVRTC at run time (cudarc, dynamic loading), compiles the
//! kernels a run needs to cubins for the device (through the disk cache), and runs one node at a time,
//! synchronising after each launch so a fault is charged to the node that caused it.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, DriverError};
use cudarc::nvrtc;

use super::kernels::{self, Source};
use super::model::Node;
use super::ops::{rows_cols, Op};
use super::tensor::{DType, Tensor};

/// What the device is, for messages, reports and the environment record.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The device's name.
    pub name: String,
    /// Compute capability (major, minor).
    pub arch: (i32, i32),
    /// The driver's CUDA version, as `cuDriverGetVersion` reports it.
    pub driver_version: i32,
    /// NVRTC's version (major, minor).
    pub nvrtc_version: (i32, i32),
}

/// How a compile went, per source, for the log and the benchmark.
#[derive(Clone, Debug)]
pub struct CompileRecord {
    /// The kernel source file's name.
    pub source: String,
    /// True when the cubin came from the cache.
    pub cached: bool,
    /// Time spent compiling or loading it.
    pub duration: Duration,
}

/// Why the backend could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver, no device, no NVRTC: the machine, not the model.
    #[error("{0}")]
    Unavailable(String),
    /// A kernel source did not compile.
    #[error("kernel compilation failed for {source_name}:\n{log}")]
    Compile {
        /// The source file.
        source_name: String,
        /// NVRTC's log.
        log: String,
    },
    /// A driver call failed outside a node (allocation, copy).
    #[error("{0}")]
    Driver(String),
}

/// `an illegal memory access was encountered (CUDA_ERROR_ILLEGAL_ADDRESS)`.
pub fn describe(e: DriverError) -> String {
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUDA error {}", e.0 as u32));
    format!("{text} ({name}, code {})", e.0 as u32)
}

/// Checks, without panicking, that a driver, a device and NVRTC are there.
pub fn probe() -> Result<(), CudaError> {
    // cudarc panics on a missing library, so look before the first call.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "no CUDA driver found: libcuda.so could not be loaded".into(),
        ));
    }
    result::init()
        .map_err(|e| CudaError::Unavailable(format!("cuInit failed: {}", describe(e))))?;
    let count = result::device::get_count()
        .map_err(|e| CudaError::Unavailable(format!("cuDeviceGetCount failed: {}", describe(e))))?;
    if count < 1 {
        return Err(CudaError::Unavailable("no CUDA device found".into()));
    }
    if !unsafe { nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "NVRTC (libnvrtc.so) could not be loaded: install the CUDA toolkit or add its lib directory to LD_LIBRARY_PATH".into(),
        ));
    }
    Ok(())
}

/// One line about device 0 from the driver (name, architecture, driver API version), without creating
/// a context; `None` when there is no usable driver or device.
pub fn driver_summary() -> Option<String> {
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    result::init().ok()?;
    let dev = result::device::get(0).ok()?;
    let attr = |a| unsafe { result::device::get_attribute(dev, a) }.ok();
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let mut version = 0;
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .ok()?;
    let name = result::device::get_name(dev).ok()?;
    Some(format!(
        "{name}, sm_{major}{minor}, driver API {}.{}",
        version / 1000,
        version % 1000 / 10
    ))
}

struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    words: usize,
    shape: Vec<usize>,
    dtype: DType,
}

/// A live context with compiled kernels and the run's tensors.
pub struct CudaBackend {
    /// The device in use.
    pub info: DeviceInfo,
    /// Time to initialise the driver and create the context.
    pub context_time: Duration,
    /// Time to compile or load every kernel.
    pub compile_time: Duration,
    /// One record per kernel source.
    pub compiles: Vec<CompileRecord>,
    functions: HashMap<String, sys::CUfunction>,
    buffers: HashMap<String, DeviceBuffer>,
    faulted: bool,
}

fn driver(what: &str) -> impl Fn(DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver(format!("{what}: {}", describe(e)))
}

impl CudaBackend {
    /// Creates the context on device 0 (as CUDA_VISIBLE_DEVICES maps it) and loads the named kernels.
    pub fn new(
        kernel_names: &[&str],
        user: &[Source],
        cache: Option<PathBuf>,
    ) -> Result<Self, CudaError> {
        // The context time includes cuInit, which is most of the cost of a first driver call.
        let start = Instant::now();
        probe()?;
        let dev = result::device::get(0).map_err(driver("cuDeviceGet"))?;
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(driver("cuDevicePrimaryCtxRetain"))?;
        unsafe { result::ctx::set_current(ctx) }.map_err(driver("cuCtxSetCurrent"))?;
        // A free-memory query forces the context to exist now, so its cost is measured here.
        result::mem_get_info().map_err(driver("cuMemGetInfo"))?;
        let context_time = start.elapsed();
        let attr = |a| {
            unsafe { result::device::get_attribute(dev, a) }.map_err(driver("cuDeviceGetAttribute"))
        };
        let arch = (
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let mut driver_version = 0;
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(driver("cuDriverGetVersion"))?;
        let mut nvrtc_version = (0, 0);
        unsafe { nvrtc::sys::nvrtcVersion(&mut nvrtc_version.0, &mut nvrtc_version.1) }
            .result()
            .map_err(|e| CudaError::Unavailable(format!("nvrtcVersion failed: {e}")))?;
        let info = DeviceInfo {
            name: result::device::get_name(dev).map_err(driver("cuDeviceGetName"))?,
            arch,
            driver_version,
            nvrtc_version,
        };

        let start = Instant::now();
        let zoo = kernels::zoo();
        let wanted = kernels::resolve(kernel_names.iter().copied(), user, &zoo)
            .map_err(CudaError::Driver)?;
        // Group kernels by source so each translation unit is compiled and loaded once.
        let mut by_source: BTreeMap<&str, (&Source, Vec<&str>)> = BTreeMap::new();
        for (kernel, src) in &wanted {
            by_source
                .entry(src.name.as_str())
                .or_insert((src, vec![]))
                .1
                .push(kernel);
        }
        let options = kernels::compile_options(arch);
        let mut compiles = Vec::new();
        let mut functions = HashMap::new();
        for (src, names) in by_source.values() {
            let t = Instant::now();
            let key = kernels::cache_key(&src.text, &options, arch, nvrtc_version);
            let cached = cache.as_deref().and_then(|d| kernels::cache_get(d, &key));
            let was_cached = cached.is_some();
            let cubin = match cached {
                Some(c) => c,
                None => {
                    let c = compile_cubin(src, &options)?;
                    if let Some(d) = cache.as_deref() {
                        kernels::cache_put(d, &key, &c);
                    }
                    c
                }
            };
            let module = unsafe { result::module::load_data(cubin.as_ptr() as *const c_void) }
                .map_err(driver("cuModuleLoadData"))?;
            for name in names {
                let cname = CString::new(*name)
                    .map_err(|_| CudaError::Driver(format!("bad kernel name {name:?}")))?;
                let f = unsafe { result::module::get_function(module, cname) }
                    .map_err(driver("cuModuleGetFunction"))?;
                functions.insert(name.to_string(), f);
            }
            compiles.push(CompileRecord {
                source: src.name.clone(),
                cached: was_cached,
                duration: t.elapsed(),
            });
        }
        Ok(Self {
            info,
            context_time,
            compile_time: start.elapsed(),
            compiles,
            functions,
            buffers: HashMap::new(),
            faulted: false,
        })
    }

    /// Copies a host tensor to a new device buffer (plain `cuMemAlloc`, not the stream-ordered pool, so
    /// an access far past a buffer is not silently absorbed by pooled neighbours).
    pub fn put(&mut self, name: &str, t: &Tensor) -> Result<(), CudaError> {
        let words = t.to_words();
        let ptr = unsafe { result::malloc_sync(words.len() * 4) }.map_err(driver("cuMemAlloc"))?;
        unsafe { result::memcpy_htod_sync(ptr, &words) }.map_err(driver("cuMemcpyHtoD"))?;
        self.replace(
            name,
            DeviceBuffer {
                ptr,
                words: words.len(),
                shape: t.shape.clone(),
                dtype: t.dtype(),
            },
        );
        Ok(())
    }

    fn replace(&mut self, name: &str, buf: DeviceBuffer) {
        if let Some(old) = self.buffers.insert(name.to_string(), buf) {
            let _ = unsafe { result::free_sync(old.ptr) };
        }
    }

    /// Copies the named tensor back to the host.
    pub fn get(&self, name: &str) -> Result<Tensor, CudaError> {
        let b = self
            .buffers
            .get(name)
            .ok_or_else(|| CudaError::Driver(format!("tensor {name} is not on the device")))?;
        let mut words = vec![0u32; b.words];
        unsafe { result::memcpy_dtoh_sync(&mut words, b.ptr) }.map_err(driver("cuMemcpyDtoH"))?;
        Ok(Tensor::from_words(b.shape.clone(), b.dtype, &words))
    }

    /// Runs one node. `Err(line)` is the device's error, worded for the classifier.
    pub fn run(&mut self, node: &Node, out_shape: Option<(&[usize], DType)>) -> Result<(), String> {
        let r = self.launch(node, out_shape);
        if r.is_err() {
            self.faulted = true;
        }
        r
    }

    fn launch(&mut self, node: &Node, out_shape: Option<(&[usize], DType)>) -> Result<(), String> {
        let fail = |e: DriverError| {
            format!(
                "CUDA error: {} in node {} ({}, kernel {})",
                describe(e),
                node.id,
                node.op.as_str(),
                node.kernel
            )
        };
        let input = |i: usize| -> Result<&DeviceBuffer, String> {
            self.buffers
                .get(&node.inputs[i])
                .ok_or_else(|| format!("harness: tensor {} is not on the device", node.inputs[i]))
        };
        let ins: Vec<(sys::CUdeviceptr, Vec<usize>)> = (0..node.inputs.len())
            .map(|i| input(i).map(|b| (b.ptr, b.shape.clone())))
            .collect::<Result<_, _>>()?;
        // The output: a new buffer, or for an in-place node the base itself.
        let (out_ptr, out_name, fresh) = if node.inplace {
            (ins[0].0, node.inputs[0].clone(), None)
        } else {
            let (shape, dtype) = out_shape.ok_or("harness: output shape unknown")?;
            let words: usize = shape.iter().product();
            let ptr = unsafe { result::malloc_sync(words * 4) }.map_err(fail)?;
            let buf = DeviceBuffer {
                ptr,
                words,
                shape: shape.to_vec(),
                dtype,
            };
            (ptr, node.outputs[0].clone(), Some(buf))
        };
        let f = *self
            .functions
            .get(&node.kernel)
            .ok_or_else(|| format!("harness: kernel {} was not loaded", node.kernel))?;
        let shape0 = &ins[0].1;
        let total = shape0.iter().product::<usize>() as i64;
        let (rows, cols) = rows_cols(shape0);
        let (rows, cols) = (rows as i64, cols as i64);
        let mut args = Args::default();
        let threads: i64 = match node.op {
            Op::Embedding => {
                let n = ins[1].1[0] as i64;
                args.ptr(out_ptr)
                    .ptr(ins[0].0)
                    .ptr(ins[1].0)
                    .i64(n)
                    .i64(shape0[1] as i64);
                n * shape0[1] as i64
            }
            Op::Matmul => {
                let (m, k, n) = (shape0[0] as i64, shape0[1] as i64, ins[1].1[1] as i64);
                args.ptr(out_ptr)
                    .ptr(ins[0].0)
                    .ptr(ins[1].0)
                    .i64(m)
                    .i64(k)
                    .i64(n);
                m * n
            }
            Op::BiasAdd => {
                args.ptr(out_ptr)
                    .ptr(ins[0].0)
                    .ptr(ins[1].0)
                    .i64(total)
                    .i64(cols);
                total
            }
            Op::Relu | Op::Gelu | Op::Copy => {
                args.ptr(out_ptr).ptr(ins[0].0).i64(total);
                total
            }
            Op::Add => {
                args.ptr(out_ptr).ptr(ins[0].0).ptr(ins[1].0).i64(total);
                total
            }
            Op::LayerNorm => {
                args.ptr(out_ptr)
                    .ptr(ins[0].0)
                    .ptr(ins[1].0)
                    .ptr(ins[2].0)
                    .i64(rows)
                    .i64(cols)
                    .f32(node.eps);
                rows
            }
            Op::Softmax | Op::Sum | Op::Mean => {
                args.ptr(out_ptr).ptr(ins[0].0).i64(rows).i64(cols);
                rows
            }
            Op::Transpose => {
                args.ptr(out_ptr)
                    .ptr(ins[0].0)
                    .i64(shape0[0] as i64)
                    .i64(shape0[1] as i64);
                total
            }
            Op::Scatter | Op::IndexAdd => {
                if !node.inplace {
                    // Out starts as a copy of base.
                    unsafe { result::memcpy_dtod_sync(out_ptr, ins[0].0, total as usize * 4) }
                        .map_err(fail)?;
                }
                let k = ins[1].1[0] as i64;
                let inner = total / shape0[0] as i64;
                args.ptr(out_ptr)
                    .ptr(ins[1].0)
                    .ptr(ins[2].0)
                    .i64(k)
                    .i64(inner);
                k * inner
            }
        };
        let block = 256i64;
        let grid = ((threads + block - 1) / block).max(1);
        let mut params = args.pointers();
        unsafe {
            result::launch_kernel(
                f,
                (grid as u32, 1, 1),
                (block as u32, 1, 1),
                0,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(fail)?;
        // Synchronise after every node: a fault is reported here, charged to this node.
        result::ctx::synchronize().map_err(fail)?;
        if let Some(buf) = fresh {
            self.replace(&out_name, buf);
        }
        Ok(())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // After a fault the context is unusable and every call fails; the process is about to exit anyway.
        if !self.faulted {
            for b in self.buffers.values() {
                let _ = unsafe { result::free_sync(b.ptr) };
            }
        }
    }
}

/// Kernel arguments, each held in its own 8-byte slot so the pointers handed to the driver stay valid.
#[derive(Default)]
struct Args {
    slots: Vec<u64>,
}

impl Args {
    fn ptr(&mut self, p: sys::CUdeviceptr) -> &mut Self {
        self.slots.push(p);
        self
    }
    fn i64(&mut self, v: i64) -> &mut Self {
        self.slots.push(v as u64);
        self
    }
    fn f32(&mut self, v: f32) -> &mut Self {
        // Little-endian: the f32 is the slot's first four bytes, where the driver reads it.
        self.slots.push(v.to_bits() as u64);
        self
    }
    fn pointers(&mut self) -> Vec<*mut c_void> {
        self.slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect()
    }
}

fn compile_cubin(src: &Source, options: &[String]) -> Result<Vec<u8>, CudaError> {
    let text = CString::new(src.text.as_str()).map_err(|_| CudaError::Compile {
        source_name: src.name.clone(),
        log: "the source contains a NUL byte".into(),
    })?;
    let name = CString::new(src.name.as_str()).unwrap_or_else(|_| c"kernel.cu".to_owned());
    let prog =
        nvrtc::result::create_program(&text, Some(&name)).map_err(|e| CudaError::Compile {
            source_name: src.name.clone(),
            log: format!("nvrtcCreateProgram: {e}"),
        })?;
    let compiled = unsafe { nvrtc::result::compile_program(prog, options) };
    let out = match compiled {
        Err(e) => {
            let log = unsafe { nvrtc::result::get_program_log(prog) }
                .map(|l| {
                    let bytes: Vec<u8> = l
                        .iter()
                        .take_while(|&&c| c != 0)
                        .map(|&c| c as u8)
                        .collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_else(|_| format!("{e}"));
            Err(CudaError::Compile {
                source_name: src.name.clone(),
                log,
            })
        }
        Ok(()) => {
            let mut size = 0usize;
            let r = unsafe { nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size) }.result();
            let mut cubin = vec![0u8; size];
            let r = r.and_then(|_| {
                unsafe { nvrtc::sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _) }.result()
            });
            r.map(|_| cubin).map_err(|e| CudaError::Compile {
                source_name: src.name.clone(),
                log: format!("nvrtcGetCUBIN: {e}"),
            })
        }
    };
    let _ = unsafe { nvrtc::result::destroy_program(prog) };
    out
}
