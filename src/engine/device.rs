//! Device and thread selection, in one place: which device the model runs on,
//! which float type its activations use there, and how many CPU threads it gets.

use crate::error::{CandleContext, Result};
use candle_core::{DType, Device};

/// The device a user asks for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The GPU this build was made for (`cuda` or `metal` feature), else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
    Metal,
}

impl std::str::FromStr for DeviceChoice {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda),
            "metal" => Ok(DeviceChoice::Metal),
            other => Err(crate::Error::invalid_setting(
                crate::Setting::Device,
                format!("`{other}` is not one of auto, cpu, cuda, metal"),
            )),
        }
    }
}

/// The device `choice` stands for in this build: `Auto` becomes the GPU of
/// the build's feature, else the CPU; the others stay as they are.
pub fn resolve(choice: DeviceChoice) -> DeviceChoice {
    match choice {
        DeviceChoice::Auto if cfg!(feature = "cuda") => DeviceChoice::Cuda,
        DeviceChoice::Auto if cfg!(feature = "metal") => DeviceChoice::Metal,
        DeviceChoice::Auto => DeviceChoice::Cpu,
        chosen => chosen,
    }
}

/// Open the requested device. A GPU device in a build without its cargo feature
/// is an error that names the feature, not a silent fall back to the CPU.
pub fn open(choice: DeviceChoice) -> Result<Device> {
    match resolve(choice) {
        DeviceChoice::Auto | DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda if cfg!(feature = "cuda") => {
            Device::new_cuda(0).context("opening CUDA device 0")
        }
        DeviceChoice::Metal if cfg!(feature = "metal") => {
            Device::new_metal(0).context("opening Metal device 0")
        }
        DeviceChoice::Cuda => Err(crate::Error::invalid_setting(
            crate::Setting::Device,
            "this prism was built without the `cuda` feature (cargo build --release --features cuda)",
        )),
        DeviceChoice::Metal => Err(crate::Error::invalid_setting(
            crate::Setting::Device,
            "this prism was built without the `metal` feature (cargo build --release --features metal)",
        )),
    }
}

/// Make `device`'s context current on the calling thread; elsewhere a no-op.
/// A CUDA context is current per thread, and cudarc frees a tensor's memory
/// without making it current: a tensor dropped on a thread that never
/// made it current fails to free, and cudarc hands that failure ("invalid
/// device context") to the next operation on any thread. On an H200, every
/// test of engines sharing a model failed so, their threads dropping the
/// logits the batch worker sent them.
pub fn bind_to_this_thread(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        cuda.cuda_stream()
            .context()
            .bind_to_thread()
            .map_err(candle_core::Error::wrap)
            .context("making the CUDA context current on this thread")?;
    }
    #[cfg(not(feature = "cuda"))]
    let _ = device;
    Ok(())
}

/// Activations and KV cache stay in f32 on the CPU (its kernels are f32-first);
/// GPUs get bf16, which halves memory traffic at no cost to these models.
pub fn activation_dtype(device: &Device) -> DType {
    if device.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    }
}

/// Physical cores: hyper-threads share the vector units that the matmuls saturate.
pub fn default_threads() -> usize {
    candle_core::utils::get_num_threads()
}

/// How long an idle worker of candle's CPU pool spins before it sleeps,
/// unless the user sets `CANDLE_BARRIER_POOL_SPIN_LIMIT`. candle's default
/// (25,000 rounds) keeps a worker hot between the small matmuls of a decode
/// step, but beside another busy process those spinning workers take the
/// cores the other process's threads need, and both slow tenfold or more. At
/// 1,000 rounds two copies of a decode benchmark each run at about half speed,
/// as the shared cores allow, while alone decode loses under a tenth.
const SPIN_LIMIT: &str = "1000";

/// Size candle's and rayon's thread pools (`None`: their default, the
/// physical cores) and set how long candle's workers spin. Must run before
/// the first tensor operation: the pools read these once, when first used.
pub fn configure_cpu_pools(threads: Option<usize>) {
    // Called before the engine exists, while no other thread reads the environment.
    if let Some(threads) = threads {
        let threads = threads.max(1).to_string();
        std::env::set_var("CANDLE_NUM_THREADS", &threads);
        std::env::set_var("RAYON_NUM_THREADS", &threads);
    }
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", SPIN_LIMIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_the_builds_gpu_or_the_cpu() {
        let expected = if cfg!(feature = "cuda") {
            DeviceChoice::Cuda
        } else if cfg!(feature = "metal") {
            DeviceChoice::Metal
        } else {
            DeviceChoice::Cpu
        };
        assert_eq!(resolve(DeviceChoice::Auto), expected);
        assert_eq!(resolve(DeviceChoice::Cpu), DeviceChoice::Cpu);
        assert_eq!("auto".parse::<DeviceChoice>().unwrap(), DeviceChoice::Auto);
        assert!("tpu".parse::<DeviceChoice>().is_err());
    }
}
