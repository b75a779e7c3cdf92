//! Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and later): the tile registers
//! and `tdpbusd`, for integer products that several kernels reduce the same way.
//!
//! `tdpbusd C, A, B` adds to each i32 `C[m][n]` the exact sum over `k` of `A[m][k]` (u8)
//! times `B[k / 4][4n + k % 4]` (i8): a matrix product with `B` in the "VNNI" layout, four
//! bytes of `k` per column, which is how the packed activation panels of
//! [`super::qdot_repack`] already lay out a sub-block (16 columns × 4 bytes per 64-byte
//! row). The sums are exact integers, so a kernel that takes them from the tiles instead of
//! from `vpdpbusd` computes the same numbers bit for bit; one `tdpbusd` does the work of 64
//! `vpdpbusd` on 512-bit registers (measured on this machine kind: ~3.8 T multiply-adds/s
//! per core against ~0.1 T).
//!
//! The tile registers need the kernel's permission (Linux ≥ 5.16:
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, once per process) and a tile
//! configuration per thread (`ldtilecfg`), which [`configure`] loads on a thread's first
//! use. One configuration serves every AMX kernel here ([`CONFIG`]).

use std::cell::Cell;
use std::sync::OnceLock;

/// Whether the host has AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25) and the
/// kernel gave this process the tile state; `MODELC_NO_AMX=1` turns it off (to compare
/// with the AVX-512 kernels, which compute the same numbers). Linux on x86-64 only.
pub(crate) fn has_amx() -> bool {
    static AMX: OnceLock<bool> = OnceLock::new();
    *AMX.get_or_init(|| {
        if std::env::var_os("MODELC_NO_AMX").is_some() || !super::has_vnni512() {
            return false;
        }
        // CPUID leaf 7 exists on every x86-64 CPU with AVX-512 (checked above).
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        if leaf7.edx >> 24 & 1 == 0 || leaf7.edx >> 25 & 1 == 0 {
            return false;
        }
        request_tile_permission()
    })
}

/// Asks Linux for the AMX tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, 18)`); false
/// where it refuses (a kernel before 5.16, a hypervisor that hides the state) or on other
/// systems.
fn request_tile_permission() -> bool {
    #[cfg(target_os = "linux")]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: the arch_prctl system call reads only its two integer arguments; the
        // `syscall` instruction clobbers rcx and r11, declared.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret == 0
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// The tile configuration of every AMX kernel here (palette 1): all eight tiles of 16 rows
/// × 64 bytes (weight, activation and sum tiles of [`super::qdot_amx`]).
const CONFIG: [u8; 64] = {
    let mut c = [0u8; 64];
    c[0] = 1;
    // Bytes per row (u16 each, from byte 16) and rows (u8 each, from byte 48).
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    c
};

thread_local! {
    /// Whether this thread has loaded [`CONFIG`].
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// Loads [`CONFIG`] into this thread's tile configuration unless it already has it.
///
/// # Safety
/// [`has_amx`] is true.
#[inline]
pub(crate) unsafe fn configure() {
    if !CONFIGURED.get() {
        std::arch::asm!("ldtilecfg [{0}]", in(reg) CONFIG.as_ptr(), options(nostack, readonly));
        CONFIGURED.set(true);
    }
}
