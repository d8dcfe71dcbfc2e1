/*
 * LD_PRELOAD shim: this process sees an AVX2-only x86 CPU (Haswell's instruction sets) on a
 * machine that has more, and runs at native speed.
 *
 * The kernel's CPUID faulting (arch_prctl ARCH_SET_CPUID, flag `cpuid_fault`) makes every
 * CPUID instruction raise SIGSEGV; the handler below runs the real CPUID and clears the
 * bits of AVX-512 (all of it), AVX-VNNI, AVX-IFMA, AVX-NE-CONVERT, AMX, GFNI/VAES/VPCLMULQDQ
 * and the SHA/fp16 extras, so every library that dispatches on CPUID (ONNX Runtime's MLAS,
 * oneDNN and ATen in torch, numpy) picks its AVX2 kernels. Only CPUID is emulated; every
 * other instruction runs natively. XGETBV is not masked: libraries require the CPUID bit too.
 *
 * glibc's own string functions are chosen by ld.so before this runs, so memcpy & co. keep
 * their AVX-512 forms (a negligible share of an inference run).
 *
 * A program that installs its own SIGSEGV handler (Python's faulthandler, Ray's workers)
 * gets it chained behind this one: sigaction() and signal() for SIGSEGV are interposed.
 *
 * Build: cc -O2 -shared -fPIC -o hide_avx512.so hide_avx512.c -ldl
 * Run:   LD_PRELOAD=$PWD/hide_avx512.so command ...   (bench/as_avx2.py does both)
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define ARCH_SET_CPUID 0x1012

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
static struct sigaction next_segv; /* what the program asked for; zero = SIG_DFL */
static int active;

static void mask(unsigned leaf, unsigned sub, unsigned *a, unsigned *b, unsigned *c, unsigned *d) {
    if (leaf == 7 && sub == 0) {
        /* EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, SHA 29, BW 30, VL 31 */
        *b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) |
                (1u << 29) | (1u << 30) | (1u << 31));
        /* ECX: VBMI 1, VBMI2 6, GFNI 8, VAES 9, VPCLMULQDQ 10, VNNI 11, BITALG 12, VPOPCNTDQ 14 */
        *c &= ~((1u << 1) | (1u << 6) | (1u << 8) | (1u << 9) | (1u << 10) | (1u << 11) |
                (1u << 12) | (1u << 14));
        /* EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, AVX512_FP16 23, AMX-TILE 24,
           AMX-INT8 25 */
        *d &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) |
                (1u << 25));
    } else if (leaf == 7 && sub == 1) {
        /* EAX: AVX-VNNI 4, AVX512_BF16 5, AMX-FP16 21, AVX-IFMA 23; EDX: AVX-VNNI-INT8 4,
           AVX-NE-CONVERT 5, AMX-COMPLEX 8, AVX-VNNI-INT16 10, AVX10 19 */
        *a &= ~((1u << 4) | (1u << 5) | (1u << 21) | (1u << 23));
        *d &= ~((1u << 4) | (1u << 5) | (1u << 8) | (1u << 10) | (1u << 19));
    } else if (leaf == 0x1d || leaf == 0x1e || leaf == 0x24) {
        /* AMX tile and AVX10 description leaves */
        *a = *b = *c = *d = 0;
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = (ucontext_t *)context;
    greg_t *r = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    if (info->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) {
        unsigned leaf = (unsigned)r[REG_RAX], sub = (unsigned)r[REG_RCX], a, b, c, d;
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
        __cpuid_count(leaf, sub, a, b, c, d);
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
        mask(leaf, sub, &a, &b, &c, &d);
        r[REG_RAX] = a;
        r[REG_RBX] = b;
        r[REG_RCX] = c;
        r[REG_RDX] = d;
        r[REG_RIP] += 2;
        return;
    }
    /* a real fault: the program's own handler, or the default action */
    if (next_segv.sa_flags & SA_SIGINFO) {
        next_segv.sa_sigaction(sig, info, context);
    } else if (next_segv.sa_handler != SIG_DFL && next_segv.sa_handler != SIG_IGN) {
        next_segv.sa_handler(sig);
    } else {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGSEGV, &dfl, NULL);
    }
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (sig != SIGSEGV || !active) return real_sigaction(sig, act, old);
    if (old) *old = next_segv;
    if (act) next_segv = *act;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

__attribute__((constructor)) static void hide_avx512(void) {
    struct sigaction sa;
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    real_sigaction(SIGSEGV, &sa, &next_segv);
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        fprintf(stderr, "hide_avx512: this kernel or CPU has no CPUID faulting (cpuid_fault); "
                        "nothing is hidden\n");
        real_sigaction(SIGSEGV, &next_segv, NULL);
        exit(3);
    }
    active = 1;
}
