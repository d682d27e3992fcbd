# expert_cpu.mk - the ISA flags of the CPU experts' AVX2 rows (lib/expert_cpu_avx2.c).
CFLAGS_expert_cpu_avx2 := -mavx2 -mfma -mf16c
