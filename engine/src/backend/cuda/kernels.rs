//! The CUDA C sources, one module per operation family, each compiled by NVRTC with
//! [`COMMON`] in front (no toolkit header is included anywhere).

/// f16 helpers, dp4a and conversions as inline PTX, warp reductions, Q8_1 block quantization.
pub const COMMON: &str = include_str!("kernels/common.cuh");

/// One NVRTC program: a source file and the kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    pub name: &'static str,
    pub source: &'static str,
    pub kernels: &'static [&'static str],
}

/// Every module, in the order a layer uses them.
pub const MODULES: [Module; 4] = [
    Module {
        name: "norm_quant",
        source: include_str!("kernels/norm_quant.cu"),
        kernels: &[
            "add_rms_norm_quant",
            "swiglu_quant",
            "add_f32",
            "quantize_q8_1",
            "silu_mul_f32",
        ],
    },
    Module {
        name: "matvec",
        source: include_str!("kernels/matvec.cu"),
        kernels: &["matvec_q4_1", "matvec_q8_0", "argmax_rows"],
    },
    Module {
        name: "rope_kv",
        source: include_str!("kernels/rope_kv.cu"),
        kernels: &["rope_kv_store", "embed_q8_0", "embed_f16"],
    },
    Module {
        name: "attention",
        source: include_str!("kernels/attention.cu"),
        kernels: &["attn_decode", "attn_combine", "attn_prefill"],
    },
];

impl Module {
    /// The whole program NVRTC compiles: [`COMMON`], then the module.
    pub fn program(&self) -> String {
        format!("{COMMON}\n// ---- {}.cu ----\n{}", self.name, self.source)
    }
}

/// NVRTC options for a model whose heads are `head_dim` wide.
pub fn options(head_dim: usize) -> Vec<String> {
    vec![
        format!("-DHEAD_DIM={head_dim}"),
        "--std=c++17".into(),
        // IEEE division and square root, so that the twins' arithmetic is the kernels'.
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--fmad=true".into(),
    ]
}

/// The PTX ISA version a PTX text declares (`.version 8.8`).
pub fn ptx_version(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".version "))?;
    let (major, minor) = line.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The newest PTX ISA the H200 machines' driver loads: 580 is CUDA 13.0, ISA 9.0.
pub const PTX_ISA_MAX: (u32, u32) = (9, 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_kernel_is_defined_extern_c_in_its_module() {
        for m in MODULES {
            for k in m.kernels {
                let decl = format!("extern \"C\" __global__ void {k}(");
                assert!(
                    m.source.contains(&decl),
                    "{}.cu does not define {k}",
                    m.name
                );
            }
            let defined = m.source.matches("extern \"C\" __global__ void ").count();
            assert_eq!(defined, m.kernels.len(), "{}: undeclared kernels", m.name);
        }
    }

    #[test]
    fn no_source_includes_a_toolkit_header() {
        for src in MODULES.iter().map(|m| m.source).chain([COMMON]) {
            assert!(
                !src.contains("#include"),
                "a kernel source includes a header"
            );
        }
    }

    #[test]
    fn ptx_versions_are_read() {
        assert_eq!(
            ptx_version("//\n.version 8.8\n.target sm_90\n"),
            Some((8, 8))
        );
        assert_eq!(ptx_version(".target sm_90"), None);
        assert!(ptx_version(".version 8.8").is_some_and(|v| v <= PTX_ISA_MAX));
        assert!(ptx_version(".version 9.1").is_some_and(|v| v > PTX_ISA_MAX));
    }
}
