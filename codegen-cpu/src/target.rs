//! The CPU a plan's kernels are chosen for: its architecture and the instruction-set level
//! of the hand-written kernels ([`Tier`]), by name (`--cpu NAME`, as `-march`/`-mcpu` name
//! CPUs) or detected on the host.
//!
//! x86-64 CPUs form one chain of the features the kernels use: AVX2 (with FMA and F16C:
//! Haswell, Zen 1–3), AVX-512 F/VL/BW (Skylake-X), AVX-512 VNNI (Cascade Lake), AVX-512
//! VBMI (Ice Lake, Zen 4, Zen 5), AMX-INT8 (Sapphire Rapids and later). Every level computes
//! the same numbers (the kernels of each level are tested against the others); a level only
//! says which routines may run. aarch64 has no hand-written vector kernels yet: its level is
//! [`Tier::Plain`] (Cranelift generates the matmul kernels for it).
//!
//! A plan compiled for a level runs on a CPU that has it: [`CpuTarget::check_host`] refuses
//! others, and the row-dot kernels never take routines above the host's level
//! (`crate::rows::RowDot::new`), so no instruction the host lacks can run.

use serde::{Deserialize, Serialize};

/// The instruction-set architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// x86-64 (AMD64).
    X86_64,
    /// AArch64 (ARMv8-A and later).
    Aarch64,
}

impl Arch {
    /// The architecture this process runs on (`None` on one modelc has no kernels for).
    pub fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// Its name as Rust's `target_arch` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

/// The instruction-set level of the hand-written kernels, lowest first: a level implies
/// every level below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// No vector routines: the plain Rust kernels (which compute the same values).
    Plain,
    /// AVX2, FMA and F16C.
    Avx2,
    /// AVX-512 F, VL and BW: 16 f32 lanes, 32 registers.
    Avx512,
    /// AVX-512 VNNI: `vpdpbusd` (four u8 × i8 products into an i32 lane).
    Avx512Vnni,
    /// AVX-512 VBMI: byte permutes across a 512-bit register.
    Avx512Vbmi,
    /// AMX-TILE and AMX-INT8: `tdpbusd` on tile registers.
    Amx,
}

impl Tier {
    /// Every level, lowest first.
    pub const ALL: [Tier; 6] = [
        Tier::Plain,
        Tier::Avx2,
        Tier::Avx512,
        Tier::Avx512Vnni,
        Tier::Avx512Vbmi,
        Tier::Amx,
    ];

    /// Its name in plans and messages.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Plain => "plain",
            Tier::Avx2 => "avx2",
            Tier::Avx512 => "avx512",
            Tier::Avx512Vnni => "avx512vnni",
            Tier::Avx512Vbmi => "avx512vbmi",
            Tier::Amx => "amx",
        }
    }

    /// The level named `name` ([`Tier::name`]).
    pub fn from_name(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The highest level this host runs (`MODELC_NO_AVX512=1` and `MODELC_NO_AMX=1` in the
    /// environment lower it, as they switch those routines off).
    pub fn host() -> Tier {
        static HOST: std::sync::OnceLock<Tier> = std::sync::OnceLock::new();
        *HOST.get_or_init(|| {
            Tier::ALL
                .into_iter()
                .rev()
                .find(|t| t.host_has())
                .unwrap_or(Tier::Plain)
        })
    }

    /// Whether this host has every feature of the level.
    fn host_has(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::handwritten as h;
            match self {
                Tier::Plain => true,
                Tier::Avx2 => h::has_avx2(),
                Tier::Avx512 => h::has_avx512() && std::is_x86_feature_detected!("avx512bw"),
                Tier::Avx512Vnni => Tier::Avx512.host_has() && h::has_vnni512(),
                Tier::Avx512Vbmi => {
                    Tier::Avx512Vnni.host_has() && std::is_x86_feature_detected!("avx512vbmi")
                }
                Tier::Amx => Tier::Avx512Vbmi.host_has() && h::amx::has_amx(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Tier::Plain
        }
    }

    // What a level has, for the routine selectors (`crate::handwritten`). They ask the level
    // only, so that kernels can be chosen for a CPU other than the host; the row-dot kernels
    // that run them never take a level above the host's (`crate::rows::RowDot`).

    /// The level has the AVX2 routines.
    pub(crate) fn avx2(self) -> bool {
        self >= Tier::Avx2
    }

    /// The level has the AVX-512 VNNI routines (256- and 512-bit, with BW).
    pub(crate) fn vnni(self) -> bool {
        self >= Tier::Avx512Vnni
    }

    /// The level has the routines that also need AVX-512 VBMI.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn vbmi(self) -> bool {
        self >= Tier::Avx512Vbmi
    }

    /// The level has the AMX tile routines.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn amx(self) -> bool {
        self >= Tier::Amx
    }

    /// Which build of the two-build tile routines runs at this level (`None`: the plain
    /// routines).
    pub(crate) fn isa(self) -> Option<crate::handwritten::qdot::Isa> {
        use crate::handwritten::qdot::Isa;
        if self.vnni() {
            Some(Isa::Vnni)
        } else if self.avx2() {
            Some(Isa::Avx2)
        } else {
            None
        }
    }
}

/// A CPU the kernels are chosen for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuTarget {
    /// What `--cpu` named (`native` for the host's own).
    #[serde(rename = "cpu")]
    pub name: String,
    /// Its architecture.
    pub arch: Arch,
    /// The level of its hand-written kernels.
    pub tier: Tier,
    /// Whether the decode kernels prefetch the weight rows ahead in software. On Intel cores
    /// it pays (decode of the synthetic 1B went from 0.88–1.03× to 1.04–1.08× llama.cpp's on
    /// a Sapphire Rapids); on AMD Zen 4 the same prefetches held decode back by 12–26%
    /// (issue 39's measurement: the hardware prefetchers stream the rows better alone).
    #[serde(default = "yes")]
    pub prefetch: bool,
}

fn yes() -> bool {
    true
}

/// The CPU names `--cpu` takes besides `native`, with their architecture, level and
/// whether software prefetch pays ([`CpuTarget::prefetch`]) (the names of GCC's and LLVM's
/// `-march` / `-mcpu`).
const NAMED: &[(&str, Arch, Tier, bool)] = &[
    ("x86-64", Arch::X86_64, Tier::Plain, true),
    ("x86-64-v2", Arch::X86_64, Tier::Plain, true),
    ("x86-64-v3", Arch::X86_64, Tier::Avx2, true),
    ("haswell", Arch::X86_64, Tier::Avx2, true),
    ("skylake", Arch::X86_64, Tier::Avx2, true),
    ("alderlake", Arch::X86_64, Tier::Avx2, true),
    ("znver2", Arch::X86_64, Tier::Avx2, true),
    ("znver3", Arch::X86_64, Tier::Avx2, true),
    ("x86-64-v4", Arch::X86_64, Tier::Avx512, true),
    ("skylake-avx512", Arch::X86_64, Tier::Avx512, true),
    ("cascadelake", Arch::X86_64, Tier::Avx512Vnni, true),
    ("icelake-server", Arch::X86_64, Tier::Avx512Vbmi, true),
    ("tigerlake", Arch::X86_64, Tier::Avx512Vbmi, true),
    ("znver4", Arch::X86_64, Tier::Avx512Vbmi, false),
    ("znver5", Arch::X86_64, Tier::Avx512Vbmi, false),
    ("sapphirerapids", Arch::X86_64, Tier::Amx, true),
    ("emeraldrapids", Arch::X86_64, Tier::Amx, true),
    ("graniterapids", Arch::X86_64, Tier::Amx, true),
    ("armv8-a", Arch::Aarch64, Tier::Plain, true),
    ("cortex-a53", Arch::Aarch64, Tier::Plain, true),
    ("neoverse-n1", Arch::Aarch64, Tier::Plain, true),
    ("neoverse-v1", Arch::Aarch64, Tier::Plain, true),
    ("neoverse-v2", Arch::Aarch64, Tier::Plain, true),
    ("apple-m1", Arch::Aarch64, Tier::Plain, true),
    ("apple-m2", Arch::Aarch64, Tier::Plain, true),
];

impl CpuTarget {
    /// The host CPU (`native`).
    ///
    /// # Errors
    /// A host architecture modelc has no kernels for.
    pub fn host() -> Result<CpuTarget, String> {
        let arch = Arch::host().ok_or_else(|| {
            format!(
                "this CPU architecture ({}) has no modelc kernels (x86_64 and aarch64 do)",
                std::env::consts::ARCH
            )
        })?;
        Ok(CpuTarget {
            name: "native".to_string(),
            arch,
            tier: Tier::host(),
            prefetch: !amd_zen4_or_later(),
        })
    }

    /// The CPU `name` names: `native`, a name of [`CpuTarget::names`], or an architecture
    /// with a level (`x86_64+avx512vnni`).
    ///
    /// # Errors
    /// An unknown name, listing the known ones.
    pub fn named(name: &str) -> Result<CpuTarget, String> {
        if name == "native" {
            return CpuTarget::host();
        }
        if let Some(&(n, arch, tier, prefetch)) = NAMED.iter().find(|(n, ..)| *n == name) {
            return Ok(CpuTarget {
                name: n.to_string(),
                arch,
                tier,
                prefetch,
            });
        }
        if let Some((a, t)) = name.split_once('+') {
            let arch = [Arch::X86_64, Arch::Aarch64]
                .into_iter()
                .find(|x| x.name() == a);
            let tier = Tier::from_name(t);
            if let (Some(arch), Some(tier)) = (arch, tier) {
                if arch == Arch::X86_64 || tier == Tier::Plain {
                    return Ok(CpuTarget {
                        name: name.to_string(),
                        arch,
                        tier,
                        prefetch: true,
                    });
                }
            }
        }
        Err(format!(
            "unknown CPU '{name}' (known: native, {}; or x86_64+LEVEL with a level of {})",
            CpuTarget::names().join(", "),
            Tier::ALL.map(Tier::name).join(", ")
        ))
    }

    /// The names [`CpuTarget::named`] knows besides `native`.
    pub fn names() -> Vec<&'static str> {
        NAMED.iter().map(|(n, ..)| *n).collect()
    }

    /// Whether this host can run kernels chosen for this CPU.
    ///
    /// # Errors
    /// Another architecture, or a level above the host's, saying what to do.
    pub fn check_host(&self) -> Result<(), String> {
        let host = CpuTarget::host()?;
        if host.arch != self.arch {
            return Err(format!(
                "the program was compiled for {} ({}); this CPU is {}: compile it again with --cpu native",
                self.name,
                self.arch.name(),
                host.arch.name()
            ));
        }
        if self.tier > host.tier {
            return Err(format!(
                "the program was compiled for {} (kernels up to {}); this CPU has {}: compile it again with --cpu native",
                self.name,
                self.tier.name(),
                host.tier.name()
            ));
        }
        Ok(())
    }
}

/// Whether the host is an AMD Zen 4 or later core, where software prefetch of the weight
/// rows measured slower ([`CpuTarget::prefetch`]): CPUID vendor `AuthenticAMD` with
/// AVX-512 (which AMD cores have from Zen 4 on). Zen 3 and earlier were not measured and
/// keep it.
fn amd_zen4_or_later() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 0 (the vendor) exists on every x86-64 CPU.
        let l0 = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [l0.ebx, l0.edx, l0.ecx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        vendor == b"AuthenticAMD" && std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for n in CpuTarget::names() {
            let t = CpuTarget::named(n).unwrap();
            assert_eq!(t.name, n);
        }
        let t = CpuTarget::named("x86_64+avx2").unwrap();
        assert_eq!((t.arch, t.tier), (Arch::X86_64, Tier::Avx2));
        assert!(!CpuTarget::named("znver4").unwrap().prefetch);
        assert!(CpuTarget::named("sapphirerapids").unwrap().prefetch);
        assert!(CpuTarget::named("aarch64+amx").is_err());
        let e = CpuTarget::named("pentium").unwrap_err();
        assert!(
            e.contains("unknown CPU 'pentium'") && e.contains("znver4"),
            "{e}"
        );
        for t in Tier::ALL {
            assert_eq!(Tier::from_name(t.name()), Some(t));
        }
    }

    #[test]
    fn the_host_runs_its_own_and_lower_levels() {
        let host = CpuTarget::host().unwrap();
        assert!(host.check_host().is_ok());
        for t in Tier::ALL.into_iter().filter(|&t| t <= host.tier) {
            let lower = CpuTarget {
                tier: t,
                ..host.clone()
            };
            assert!(lower.check_host().is_ok());
        }
        if host.tier < Tier::Amx {
            let higher = CpuTarget {
                tier: Tier::Amx,
                ..host.clone()
            };
            assert!(higher.check_host().unwrap_err().contains("--cpu native"));
        }
    }
}
