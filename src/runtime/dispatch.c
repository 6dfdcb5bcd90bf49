/*
 * dispatch.c - which instruction set the fast kernels use, decided once per
 * process, overridable, and reported.
 *
 * The decision (BLIS-style): a path runs only when the CPU has the instructions
 * (cpuid) AND the operating system saves the registers they use across context
 * switches (xgetbv: XCR0 bits for the SSE/AVX state, plus the opmask and the upper
 * ZMM state for AVX-512). The best such path is the default. The environment
 * variable ATTN_ARCH=ref|scalar|avx2|avx512|avx512bf16|amx (or auto) forces one; a forced path the
 * machine cannot run falls back to the best one, and the reason says so. A
 * context's ctx->arch, when not AUTO, wins over both for calls made with that
 * context; a ctx->arch the machine cannot run is an UNSUPPORTED error, since the
 * caller asked for it in code.
 *
 * attn_arch_reason() returns the sentence the benchmark and the experiment's trace
 * print. The library itself never prints.
 */
/* syscall() for arch_prctl is a GNU/BSD extension of unistd.h. */
#define _DEFAULT_SOURCE 1
#include "dispatch.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(ATTN_HAVE_X86) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define ATTN_DISPATCH_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

typedef struct cpu_features {
    int avx2;   /* AVX2, FMA and F16C, with the YMM state enabled by the OS */
    int avx512; /* AVX-512 F, DQ, BW, VL, with the opmask and ZMM state enabled */
    unsigned extra; /* ATTN_CPU_* bits (attn_cpu_features) */
    char detail[224];
    char vendor[13];      /* cpuid leaf 0: "GenuineIntel", "AuthenticAMD", ... */
    unsigned family;      /* display family and model (leaf 1, extended fields added) */
    unsigned model;
    int64_t l1d_kib;      /* data cache sizes (leaf 4, or 0x8000001D on AMD); 0 unknown */
    int64_t l2_kib;
    char extra_words[96];
} cpu_features;

/* The fused kernel's tile sizes on this machine and the microarchitecture they were
 * chosen for (attn__fused_tiles). */
typedef struct cpu_tiles {
    const char *uarch;
    int64_t br, bc;
    char source[64]; /* "chosen for it", or what ATTN_TILE did */
    int forced;      /* 1: ATTN_TILE set br and bc */
    int64_t amx_br, amx_bc; /* the bfloat16 path's on AMX (attn__amx_tiles) */
    attn__microtile microtile;  /* the AVX-512 body (attn__fused_microtile) */
    char mt_source[64];         /* "chosen for it", or what ATTN_MICROTILE did */
} cpu_tiles;

static pthread_once_t dispatch_once = PTHREAD_ONCE_INIT;
static cpu_features dispatch_cpu;
static cpu_tiles dispatch_tiles;
static attn_arch dispatch_arch = ATTN_ARCH_SCALAR;
static char dispatch_reason[768];

static void dispatch_decide(void);

#ifdef ATTN_DISPATCH_X86
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    /* xgetbv with ecx = 0 reads XCR0; only valid when cpuid says OSXSAVE. */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

#ifdef ATTN_DISPATCH_X86
/* The L1 data and L2 sizes from the deterministic cache parameters, one subleaf per
 * cache (Intel leaf 4, AMD leaf 0x8000001D, the same layout): size = ways x
 * partitions x line size x sets, each field stored minus one. */
static void detect_caches(cpu_features *f, unsigned leaf)
{
    for (unsigned sub = 0; sub < 16; sub++) {
        unsigned a, b, c, d;
        __cpuid_count(leaf, sub, a, b, c, d);
        const unsigned type = a & 31, level = (a >> 5) & 7;
        if (type == 0)
            break;
        const int64_t bytes = (int64_t)((b >> 22) + 1) * (((b >> 12) & 0x3ff) + 1) *
                              ((b & 0xfff) + 1) * ((int64_t)c + 1);
        if (level == 1 && type == 1) /* data */
            f->l1d_kib = bytes / 1024;
        else if (level == 2 && (type == 3 || type == 2)) /* unified */
            f->l2_kib = bytes / 1024;
    }
}

static void detect_identity(cpu_features *f, unsigned eax1)
{
    unsigned max0, b, c, d;
    __cpuid(0, max0, b, c, d);
    memcpy(f->vendor, &b, 4);
    memcpy(f->vendor + 4, &d, 4);
    memcpy(f->vendor + 8, &c, 4);
    f->vendor[12] = '\0';
    /* The display family adds the extended family when the base family is 15; the
     * display model adds the extended model for families 6 and 15 and above. */
    unsigned family = (eax1 >> 8) & 0xf, model = (eax1 >> 4) & 0xf;
    if (family == 15)
        family += (eax1 >> 20) & 0xff;
    if (family == 6 || family >= 15)
        model += ((eax1 >> 16) & 0xf) << 4;
    f->family = family;
    f->model = model;
    const int amd = strcmp(f->vendor, "AuthenticAMD") == 0 || strcmp(f->vendor, "HygonGenuine") == 0;
    unsigned maxe, a;
    __cpuid(0x80000000u, maxe, b, c, d);
    if (amd && maxe >= 0x8000001Du) {
        __cpuid(0x80000001u, a, b, c, d);
        if ((c >> 22) & 1) /* topology extensions: leaf 0x8000001D is valid */
            detect_caches(f, 0x8000001Du);
    } else if (!amd && max0 >= 4) {
        detect_caches(f, 4);
    }
    if (amd && f->l1d_kib == 0 && maxe >= 0x80000006u) {
        __cpuid(0x80000005u, a, b, c, d);
        f->l1d_kib = c >> 24;
        __cpuid(0x80000006u, a, b, c, d);
        f->l2_kib = c >> 16;
    }
}

/* The 16-bit features of ATTN_CPU_*: cpuid leaf 1 ecx bit 29 (F16C), leaf 7
 * subleaf 0 edx bits 23 (AVX512-FP16), 22 (AMX-BF16) and 24 (AMX-TILE), leaf 7
 * subleaf 1 eax bit 5 (AVX512-BF16), each only with the register state the OS
 * enables in XCR0 (YMM for F16C, ZMM for the AVX-512 ones, bits 17 and 18 for the
 * tiles). Linux also hands out the tile data state only on request, once per
 * process (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)), so AMX counts as
 * present only when that request succeeds. */
static unsigned detect_extra(unsigned ecx1, uint64_t xcr0, int ymm_os, int zmm_os)
{
    unsigned a = 0, b = 0, c = 0, d = 0, e7 = 0, a71 = 0, bits = 0;
    const unsigned max = __get_cpuid_max(0, NULL);
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        e7 = d;
        if (a >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            a71 = a;
        }
    }
    if (((ecx1 >> 29) & 1) && ymm_os)
        bits |= ATTN_CPU_F16C;
    if (((a71 >> 5) & 1) && zmm_os)
        bits |= ATTN_CPU_AVX512_BF16;
    if (((e7 >> 23) & 1) && zmm_os)
        bits |= ATTN_CPU_AVX512_FP16;
    if (((e7 >> 22) & 1) && ((e7 >> 24) & 1) && (xcr0 & 0x60000) == 0x60000) {
#if defined(__linux__) && defined(SYS_arch_prctl)
        /* ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 (asm/prctl.h). */
        if (syscall(SYS_arch_prctl, 0x1023, 18) == 0)
            bits |= ATTN_CPU_AMX_BF16;
#else
        bits |= ATTN_CPU_AMX_BF16;
#endif
    }
    return bits;
}
#endif

static void detect_cpu(cpu_features *f)
{
    memset(f, 0, sizeof *f);
#ifdef ATTN_DISPATCH_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        snprintf(f->detail, sizeof f->detail, "cpuid leaf 1 unavailable");
        return;
    }
    detect_identity(f, a);
    const unsigned ecx1 = c;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1,
              f16c = (c >> 29) & 1;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    const int ymm_os = (xcr0 & 0x6) == 0x6;    /* XMM and YMM state */
    const int zmm_os = (xcr0 & 0xe6) == 0xe6;  /* plus opmask, ZMM_Hi256, Hi16_ZMM */
    unsigned b7 = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        b7 = b;
    }
    const int avx2 = (b7 >> 5) & 1;
    const int avx512 = ((b7 >> 16) & 1) && ((b7 >> 17) & 1) && ((b7 >> 30) & 1) &&
                       ((b7 >> 31) & 1); /* F, DQ, BW, VL */
    /* The avx2 path also needs F16C: its files are built with -mf16c, so that its
     * float16 KV-cache reads widen in registers (vcvtph2ps, src/kernels/fused_split.h).
     * Every CPU shipped with AVX2 and FMA has F16C (Intel's since Ivy Bridge and
     * AMD's since Piledriver, both older than their first AVX2 cores); one without
     * it, a virtual machine that hides the bit, say, runs the scalar path, and the
     * detail says why. */
    f->avx2 = avx && avx2 && fma && f16c && ymm_os;
    f->avx512 = f->avx2 && avx512 && zmm_os;
    f->extra = detect_extra(ecx1, xcr0, ymm_os, zmm_os);
    snprintf(f->detail, sizeof f->detail,
             "cpuid avx2=%d fma=%d f16c=%d avx512f/dq/bw/vl=%d, xgetbv XCR0=0x%llx (ymm %s, "
             "zmm %s)%s",
             avx2, fma, f16c, avx512, (unsigned long long)xcr0, ymm_os ? "on" : "off",
             zmm_os ? "on" : "off",
             avx && avx2 && fma && ymm_os && !f16c
                 ? "; no F16C, which the avx2 and avx512 paths need, so scalar"
                 : "");
#else
    snprintf(f->detail, sizeof f->detail, "not an x86-64 build: portable C only");
#endif
}

/* The bfloat16 paths need the avx512 build and the features of their kernels: the
 * AMX path also converts with AVX512-BF16 (vcvtne2ps2bf16), so it needs both. */
/* ATTN_BF16_EMULATE=1 lets the avx512bf16 path run on an AVX-512 CPU without
 * AVX512-BF16, its vdpbf16ps emulated by FMAs (src/kernels/sdpa_bf16_avx512.c), so
 * that the tests check that path's packing, masking and softmax on any AVX-512
 * machine. It is read once, with the rest of the decision, and never makes the
 * emulation the automatic choice. ATTN_BF16_EMULATE=always runs the emulation even
 * where the CPU has the instruction, so that a test can hold the two kernels to the
 * same bits (tests/test_bf16_lazy.c). */
static int bf16_emulate;
static int bf16_emulate_always;

static int has_avx512_bf16(const cpu_features *f)
{
    return f->avx512 && (f->extra & ATTN_CPU_AVX512_BF16);
}

static int has_amx(const cpu_features *f)
{
    return has_avx512_bf16(f) && (f->extra & ATTN_CPU_AMX_BF16);
}

/* The automatic choice. amx where the CPU has the tiles. avx512bf16 on AMD cores
 * with AVX512-BF16 and no AMX (Zen 4, Zen 5): there vdpbf16ps issues as often as a
 * 512-bit FMA and does twice its multiply-adds, and the bfloat16 kernel measured
 * 1.74-1.91x the float32 kernel (S2, S3, S4, S8, 2 threads, AMD EPYC family 25
 * model 17; docs/half-precision.md), where widened copies ran 0.97-1.0x. Not on Intel without AMX: on the
 * Sapphire Rapids class the same kernel measured 0.61-0.73x the float32 kernel on
 * widened copies (S2, S4, 2 threads), so an Intel core with AVX512-BF16 but no
 * tiles keeps avx512. Either bfloat16 arch runs float32 on the avx512 kernels
 * (attn__arch_isa), so the choice changes only bfloat16 calls. */
static attn_arch best_arch(const cpu_features *f)
{
    if (has_amx(f))
        return ATTN_ARCH_AMX;
    if (has_avx512_bf16(f) && strcmp(f->vendor, "AuthenticAMD") == 0)
        return ATTN_ARCH_AVX512_BF16;
    if (f->avx512)
        return ATTN_ARCH_AVX512;
    if (f->avx2)
        return ATTN_ARCH_AVX2;
    return ATTN_ARCH_SCALAR;
}

/* ---- Tile sizes per microarchitecture ----------------------------------------
 *
 * The fused kernel's query tile (br rows) and key tile (bc keys) are chosen here,
 * once, from the vendor, family and model and the L1/L2 sizes, and recorded in every
 * plan (attn__sdpa_plan's br and bc). They change which keys are summed together,
 * so they may change the last bits between two machines; they never depend on the
 * thread count, so on one machine the result is the same for any number of threads.
 *
 * The families below differ in what limits the tile: Intel's Sapphire Rapids class
 * (Golden Cove / Raptor Cove cores) runs two 512-bit FMAs a cycle from a 48 KiB L1
 * and a 2 MiB L2; Zen 4 runs AVX-512 as two 256-bit halves from a 32 KiB L1 and a
 * 1 MiB L2; Zen 5 has full 512-bit FMAs, a 48 KiB L1 and a 1 MiB L2; AVX2-only cores
 * have 16 vector registers and 32-48 KiB of L1. Which sizes suit which family is
 * measured where the machine was at hand and otherwise kept at the sizes the kernel
 * was first tuned with (docs/performance.md says which). ATTN_TILE=BRxBC (br a
 * multiple of 32 from 32 to 512, bc a multiple of 8 from 8 to 1024) overrides the
 * choice, for tuning and for the tests; a value outside those rules is ignored, and
 * the reason says so. */
static const char *classify_uarch(const cpu_features *f)
{
    if (strcmp(f->vendor, "GenuineIntel") == 0 && f->family == 6) {
        switch (f->model) {
        case 0x8f: /* Sapphire Rapids */
        case 0xcf: /* Emerald Rapids */
        case 0xad: /* Granite Rapids */
        case 0xae:
            return "Intel Sapphire Rapids class";
        default:
            return f->avx512 ? "Intel AVX-512 core" : f->avx2 ? "Intel AVX2 core" : "Intel core";
        }
    }
    if (strcmp(f->vendor, "AuthenticAMD") == 0) {
        if (f->family == 0x1a)
            return "AMD Zen 5";
        if (f->family == 0x19)
            return f->avx512 ? "AMD Zen 4" : "AMD Zen 3";
        if (f->family == 0x17)
            return "AMD Zen 2";
    }
    return f->avx512 ? "AVX-512 core" : f->avx2 ? "AVX2 core" : "generic core";
}

/* The choice itself: (br, bc) per family, and how each entry was decided. On the
 * Sapphire Rapids class the sizes were swept (br 32-128, bc 32-256, S2 on one core,
 * docs/performance.md) and 64 x 64 was fastest; Zen 4 keeps the sizes the kernel
 * was tuned with on Zen 5, which a sweep there found no better size than. */
static const struct {
    const char *uarch;
    int64_t br, bc;
} tile_table[] = {
    {"Intel Sapphire Rapids class", 64, 64}, /* swept on family 6 model 207 */
    {"AMD Zen 5", 64, 64},                   /* where the kernel was first tuned */
    {"AMD Zen 4", 64, 64},                   /* family 25 model 17: S2-S8 at 81-96%
                                                of the FMA peak; 32x64 to 128x128
                                                within the noise of it (S2, S8) */
};

static void default_tiles(const char *uarch, int64_t *br, int64_t *bc)
{
    *br = 64;
    *bc = 64;
    for (size_t i = 0; i < sizeof tile_table / sizeof tile_table[0]; i++)
        if (strcmp(uarch, tile_table[i].uarch) == 0) {
            *br = tile_table[i].br;
            *bc = tile_table[i].bc;
        }
}

/* "BRxBC" with br a multiple of 32 in [32, 512] and bc a multiple of 8 in [8, 1024]. */
static int parse_tiles(const char *s, int64_t *br, int64_t *bc)
{
    /* Digits only: strtol alone would also take a leading blank or sign. */
    if (*s < '0' || *s > '9')
        return 0;
    char *end;
    const long r = strtol(s, &end, 10);
    if (end == s || (*end != 'x' && *end != 'X'))
        return 0;
    const char *s2 = end + 1;
    if (*s2 < '0' || *s2 > '9')
        return 0;
    const long c = strtol(s2, &end, 10);
    if (end == s2 || *end != '\0')
        return 0;
    if (r < 32 || r > 512 || r % 32 != 0 || c < 8 || c > 1024 || c % 8 != 0)
        return 0;
    *br = r;
    *bc = c;
    return 1;
}

/* The bfloat16 path on AMX: its products take a few cycles a tile, so the softmax
 * between them and O^T's trips through the tile registers (loaded and stored once a
 * key tile per 32 x 32 block) bound it, and larger tiles spread those over more keys
 * and rows. On family 6 model 207 (2 threads, docs/half-precision.md) 128 x 128 ran
 * S8 (D 128) 1.1-1.6x faster than 64 x 64 and S2-S4 (D 64) within the noise of it. */
#define AMX_TILE_BR 128
#define AMX_TILE_BC 128

static void decide_tiles(const cpu_features *f, cpu_tiles *t)
{
    t->uarch = classify_uarch(f);
    default_tiles(t->uarch, &t->br, &t->bc);
    t->amx_br = AMX_TILE_BR;
    t->amx_bc = AMX_TILE_BC;
    t->forced = 0;
    snprintf(t->source, sizeof t->source, "chosen for it");
    const char *env = getenv("ATTN_TILE");
    if (env && *env) {
        int64_t br, bc;
        if (parse_tiles(env, &br, &bc)) {
            t->br = t->amx_br = br;
            t->bc = t->amx_bc = bc;
            t->forced = 1;
            snprintf(t->source, sizeof t->source, "forced by ATTN_TILE=%.16s", env);
        } else {
            snprintf(t->source, sizeof t->source, "ATTN_TILE=%.16s ignored (not BRxBC)", env);
        }
    }
}

/* ---- Micro-tile shapes per microarchitecture ---------------------------------
 *
 * The AVX-512 build of the fused kernel comes in two bodies that differ only in
 * which products run together (src/kernels/sdpa_fused_4x4_avx512.c says why): 8 x 2
 * (8 key broadcasts against 2 vectors of query rows; 8 rows x 2 vectors of value
 * columns) and 4 x 4 (4 broadcasts against 4 vectors; 4 rows x 4 vectors). Zen 4
 * and Zen 5 get 4 x 4, which llvm-mca-19 models about 20% faster there (their
 * 512-bit broadcasts take an FP pipe from the FMAs) and which measured 2-4% faster
 * than 8 x 2 on Zen 4 (family 25 model 17: S2, S4, S8, 2 threads); the Sapphire Rapids class and
 * every other core get 8 x 2, which measured as fast or faster on family 6 model 207
 * (docs/performance.md says which figures are measured and which modelled).
 * The fused backward follows the same choice (sdpa_fused_backward_4x4_avx512.c: 4 x 4
 * register tiles for the scores, dP, dQ, dK and dV; 3-5% faster on Zen 4, the same
 * bits). ATTN_MICROTILE=8x2|4x4 overrides the choice; any other value is ignored, and
 * the reason says so. The AVX2 and portable builds have one shape each. */
static attn__microtile default_microtile(const char *uarch)
{
    if (strcmp(uarch, "AMD Zen 4") == 0 || strcmp(uarch, "AMD Zen 5") == 0)
        return ATTN__MICROTILE_4X4; /* measured on Zen 4, modelled on Zen 5 */
    return ATTN__MICROTILE_8X2;
}

static const char *microtile_name(attn__microtile m)
{
    return m == ATTN__MICROTILE_4X4 ? "4x4" : "8x2";
}

static void decide_microtile(cpu_tiles *t)
{
    t->microtile = default_microtile(t->uarch);
    snprintf(t->mt_source, sizeof t->mt_source, "chosen for it");
    const char *env = getenv("ATTN_MICROTILE");
    if (!env || !*env)
        return;
    if (strcmp(env, "8x2") == 0 || strcmp(env, "4x4") == 0) {
        t->microtile = env[0] == '4' ? ATTN__MICROTILE_4X4 : ATTN__MICROTILE_8X2;
        snprintf(t->mt_source, sizeof t->mt_source, "forced by ATTN_MICROTILE=%s", env);
    } else {
        snprintf(t->mt_source, sizeof t->mt_source, "ATTN_MICROTILE=%.16s ignored (not 8x2|4x4)",
                 env);
    }
}

attn__microtile attn__fused_microtile(void)
{
    pthread_once(&dispatch_once, dispatch_decide);
    return dispatch_tiles.microtile;
}

void attn__fused_tiles(int64_t *br, int64_t *bc)
{
    pthread_once(&dispatch_once, dispatch_decide);
    *br = dispatch_tiles.br;
    *bc = dispatch_tiles.bc;
}

void attn__amx_tiles(int64_t *br, int64_t *bc)
{
    pthread_once(&dispatch_once, dispatch_decide);
    *br = dispatch_tiles.amx_br;
    *bc = dispatch_tiles.amx_bc;
}

void attn__cpu_caches(const char **uarch, int64_t *l1d_kib, int64_t *l2_kib)
{
    pthread_once(&dispatch_once, dispatch_decide);
    *uarch = dispatch_tiles.uarch;
    *l1d_kib = dispatch_cpu.l1d_kib;
    *l2_kib = dispatch_cpu.l2_kib;
}

static int parse_arch(const char *s, attn_arch *arch)
{
    static const struct { const char *name; attn_arch arch; } names[] = {
        {"auto", ATTN_ARCH_AUTO},     {"ref", ATTN_ARCH_REF},
        {"scalar", ATTN_ARCH_SCALAR}, {"avx2", ATTN_ARCH_AVX2},
        {"avx512", ATTN_ARCH_AVX512}, {"avx512bf16", ATTN_ARCH_AVX512_BF16},
        {"amx", ATTN_ARCH_AMX},
    };
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++)
        if (strcmp(s, names[n].name) == 0) {
            *arch = names[n].arch;
            return 1;
        }
    return 0;
}

static int cpu_supports(const cpu_features *f, attn_arch arch)
{
    switch (arch) {
    case ATTN_ARCH_AUTO:
    case ATTN_ARCH_REF:
    case ATTN_ARCH_SCALAR:
        return 1;
    case ATTN_ARCH_AVX2:
        return f->avx2;
    case ATTN_ARCH_AVX512:
        return f->avx512;
    case ATTN_ARCH_AVX512_BF16:
        return has_avx512_bf16(f) || (f->avx512 && bf16_emulate);
    case ATTN_ARCH_AMX:
        return has_amx(f);
    }
    return 0;
}

static void dispatch_decide(void)
{
    detect_cpu(&dispatch_cpu);
    const char *emu = getenv("ATTN_BF16_EMULATE");
    bf16_emulate_always = emu && strcmp(emu, "always") == 0;
    bf16_emulate = emu && (strcmp(emu, "1") == 0 || bf16_emulate_always);
    decide_tiles(&dispatch_cpu, &dispatch_tiles);
    decide_microtile(&dispatch_tiles);
    const unsigned x = dispatch_cpu.extra;
    snprintf(dispatch_cpu.extra_words, sizeof dispatch_cpu.extra_words,
             "f16c%s avx512-bf16%s avx512-fp16%s amx-bf16%s", x & ATTN_CPU_F16C ? "" : ":no",
             x & ATTN_CPU_AVX512_BF16 ? "" : ":no", x & ATTN_CPU_AVX512_FP16 ? "" : ":no",
             x & ATTN_CPU_AMX_BF16 ? "" : ":no");
    const attn_arch best = best_arch(&dispatch_cpu);
    const char *env = getenv("ATTN_ARCH");
    attn_arch forced = ATTN_ARCH_AUTO;
    dispatch_arch = best;
    if (!env || !*env) {
        snprintf(dispatch_reason, sizeof dispatch_reason, "auto: best path for this CPU (%s)",
                 dispatch_cpu.detail);
    } else if (!parse_arch(env, &forced)) {
        snprintf(dispatch_reason, sizeof dispatch_reason,
                 "ATTN_ARCH=%.32s is not one of ref|scalar|avx2|avx512|avx512bf16|amx|auto, so auto: %s",
                 env, dispatch_cpu.detail);
    } else if (forced == ATTN_ARCH_AUTO) {
        snprintf(dispatch_reason, sizeof dispatch_reason, "ATTN_ARCH=auto: %s",
                 dispatch_cpu.detail);
    } else if (!cpu_supports(&dispatch_cpu, forced)) {
        snprintf(dispatch_reason, sizeof dispatch_reason,
                 "ATTN_ARCH=%s, but this CPU or build cannot run it, so %s (%s)", env,
                 attn_arch_name(best), dispatch_cpu.detail);
    } else {
        dispatch_arch = forced;
        snprintf(dispatch_reason, sizeof dispatch_reason, "forced by ATTN_ARCH=%s%s", env,
                 forced == ATTN_ARCH_AVX512_BF16 && !has_avx512_bf16(&dispatch_cpu)
                     ? " (vdpbf16ps emulated by AVX-512F: ATTN_BF16_EMULATE=1)"
                 : forced == ATTN_ARCH_AVX512_BF16 && bf16_emulate_always
                     ? " (vdpbf16ps emulated by AVX-512F: ATTN_BF16_EMULATE=always)"
                     : "");
    }
    /* The machine and the tiles, so that a benchmark line says what it ran with. */
    const size_t used = strlen(dispatch_reason);
    const cpu_features *f = &dispatch_cpu;
    snprintf(dispatch_reason + used, sizeof dispatch_reason - used,
             "; %s (%s family %u model %u, L1d %lld KiB, L2 %lld KiB): fused tiles "
             "%lldx%lld, %s; AVX-512 micro-tiles %s, %s",
             dispatch_tiles.uarch, f->vendor[0] ? f->vendor : "unknown vendor", f->family,
             f->model, (long long)f->l1d_kib, (long long)f->l2_kib,
             (long long)dispatch_tiles.br, (long long)dispatch_tiles.bc, dispatch_tiles.source,
             microtile_name(dispatch_tiles.microtile), dispatch_tiles.mt_source);
    /* Where the amx path can run, its tiles too (unless ATTN_TILE set both). */
    if (has_amx(f) && !dispatch_tiles.forced) {
        const size_t at = strlen(dispatch_reason);
        snprintf(dispatch_reason + at, sizeof dispatch_reason - at,
                 "; bfloat16 on AMX: tiles %lldx%lld", (long long)dispatch_tiles.amx_br,
                 (long long)dispatch_tiles.amx_bc);
    }
}

const char *attn_arch_name(attn_arch arch)
{
    switch (arch) {
    case ATTN_ARCH_AUTO:
        return "auto";
    case ATTN_ARCH_REF:
        return "ref";
    case ATTN_ARCH_SCALAR:
        return "scalar";
    case ATTN_ARCH_AVX2:
        return "avx2";
    case ATTN_ARCH_AVX512:
        return "avx512";
    case ATTN_ARCH_AVX512_BF16:
        return "avx512bf16";
    case ATTN_ARCH_AMX:
        return "amx";
    }
    return "unknown";
}

int attn_arch_parse(const char *name, attn_arch *arch)
{
    if (!name || !arch)
        return ATTN_STATUS_INVALID_ARGUMENT;
    return parse_arch(name, arch) ? ATTN_OK : ATTN_STATUS_INVALID_ARGUMENT;
}

int attn_arch_supported(attn_arch arch)
{
    pthread_once(&dispatch_once, dispatch_decide);
    return cpu_supports(&dispatch_cpu, arch);
}

attn_arch attn_arch_best(void)
{
    pthread_once(&dispatch_once, dispatch_decide);
    return best_arch(&dispatch_cpu);
}

attn_arch attn_arch_selected(const attn_ctx *ctx)
{
    pthread_once(&dispatch_once, dispatch_decide);
    /* An arch outside the enum is not a path: report the automatic choice (the
     * kernels themselves refuse such a context with INVALID_ARGUMENT). */
    if (ctx && ctx->arch > ATTN_ARCH_AUTO && ctx->arch <= ATTN_ARCH_AMX)
        return ctx->arch;
    return dispatch_arch;
}

const char *attn_arch_reason(const attn_ctx *ctx)
{
    pthread_once(&dispatch_once, dispatch_decide);
    if (ctx && ctx->arch != ATTN_ARCH_AUTO)
        return cpu_supports(&dispatch_cpu, ctx->arch)
                   ? "forced by the context (ctx->arch)"
                   : "forced by the context (ctx->arch), but this CPU or build cannot run it";
    return dispatch_reason;
}

unsigned attn__cpu_features(void)
{
    pthread_once(&dispatch_once, dispatch_decide);
    return dispatch_cpu.extra;
}

int attn__bf16_emulate_always(void)
{
    pthread_once(&dispatch_once, dispatch_decide);
    return bf16_emulate_always;
}

unsigned attn_cpu_features(void) { return attn__cpu_features(); }

const char *attn_cpu_features_string(void)
{
    pthread_once(&dispatch_once, dispatch_decide);
    return dispatch_cpu.extra_words;
}

int attn__arch_resolve(attn_ctx *ctx, attn_arch *arch)
{
    pthread_once(&dispatch_once, dispatch_decide);
    if (ctx && ctx->arch != ATTN_ARCH_AUTO) {
        if ((int)ctx->arch < ATTN_ARCH_AUTO || (int)ctx->arch > ATTN_ARCH_AMX)
            return attn__fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                              "ctx->arch = %d is not an attn_arch value", (int)ctx->arch);
        if (!cpu_supports(&dispatch_cpu, ctx->arch))
            return attn__fail(ctx, ATTN_STATUS_UNSUPPORTED,
                              "ctx->arch = %s, but this CPU or build cannot run it (%s)",
                              attn_arch_name(ctx->arch), dispatch_cpu.detail);
        *arch = ctx->arch;
        return ATTN_OK;
    }
    *arch = dispatch_arch;
    return ATTN_OK;
}
