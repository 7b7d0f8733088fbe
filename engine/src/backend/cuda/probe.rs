//! What `--device cuda` checks before anything touches cudarc's loaders (which panic when a
//! library is missing): the driver library, NVRTC, then a GPU.

use crate::error::{Error, Result};

/// What was found: the device count and the driver's CUDA version (e.g. 13000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub devices: usize,
    pub driver_version: i32,
}

/// The driver library, NVRTC (unless `SLUICE_CUDA_PTX` names the PTX to load) and at least one
/// GPU; the error names the first thing missing, on one line.
pub fn probe() -> Result<Found> {
    // SAFETY: these only try to dlopen the libraries by their usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "no CUDA driver: libcuda.so could not be loaded (is the NVIDIA driver installed?)"
                .into(),
        ));
    }
    // SAFETY: as above, for libnvrtc. Not needed where the PTX comes from `make cuda-check`
    // (`SLUICE_CUDA_PTX`): a GPU machine whose NVRTC is 13.x has no libnvrtc.so.12.
    if std::env::var_os("SLUICE_CUDA_PTX").is_none()
        && !unsafe { cudarc::nvrtc::sys::is_culib_present() }
    {
        return Err(Error::CudaUnavailable(
            "no NVRTC: libnvrtc.so.12 could not be loaded (pip install nvidia-cuda-nvrtc-cu12 and \
             put its lib directory on LD_LIBRARY_PATH, or set SLUICE_CUDA_PTX to the PTX `make \
             cuda-check` wrote)"
                .into(),
        ));
    }
    let unavailable = |what: &str, e: cudarc::driver::DriverError| {
        Error::CudaUnavailable(format!("{what}: {e:?}"))
    };
    cudarc::driver::result::init().map_err(|e| unavailable("the CUDA driver did not start", e))?;
    let devices = cudarc::driver::result::device::get_count()
        .map_err(|e| unavailable("cannot count CUDA devices", e))?;
    if devices <= 0 {
        return Err(Error::CudaUnavailable("the CUDA driver sees no GPU".into()));
    }
    let mut driver_version = 0;
    // SAFETY: the driver library is loaded and initialized (checked above); the pointer is to a
    // local that outlives the call.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
    if status != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(Error::CudaUnavailable(format!(
            "cannot read the driver's version: {status:?}"
        )));
    }
    Ok(Found {
        devices: devices as usize,
        driver_version,
    })
}
