/*
 * half.h - IEEE binary16 and bfloat16 to and from binary32, scalar and
 * exact (round to nearest even, quiet NaNs as the x86 instructions make
 * them). Inline: the CPU reductions call them per element; libcohort's
 * reductions, the CUDA kernels' CPU references and the benchmarks share
 * them.
 */
#ifndef COHORT_COMMON_HALF_H
#define COHORT_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t
half_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return (u);
}

static inline float
half_bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return (f);
}

static inline float
cohort__f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;
	uint32_t u;

	if (exp == 0x1f) {
		u = sign | 0x7f800000u | (man << 13);
		if (man != 0)
			u |= 0x00400000u; /* quiet NaN, like vcvtph2ps */
	} else if (exp != 0) {
		u = sign | ((exp + 112) << 23) | (man << 13);
	} else if (man == 0) {
		u = sign;
	} else {
		/* Subnormal: value = man * 2^-24, exact in f32. */
		float f = (float)man * (1.0f / 16777216.0f);

		return (sign != 0 ? -f : f);
	}
	return (half_bits_f32(u));
}

static inline uint16_t
cohort__f32_to_f16(float f)
{
	uint32_t u = half_f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t abs = u & 0x7fffffffu;
	uint32_t exp, man, r;

	if (abs >= 0x7f800000u) {
		if (abs == 0x7f800000u)
			return (sign | 0x7c00u);
		/* NaN: keep the top payload bits, force quiet. */
		return (sign | 0x7e00u | (uint16_t)((abs >> 13) & 0x3ffu));
	}
	if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow */
		return (sign | 0x7c00u);
	exp = abs >> 23;
	if (exp >= 113) {
		/* Normal in f16: drop 13 bits, round to nearest even. The
		 * carry may ripple into the exponent, which is correct. */
		r = abs - (112u << 23);
		r = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
		return (sign | (uint16_t)r);
	}
	if (exp < 102) /* below half of the smallest subnormal */
		return (sign);
	/* Subnormal in f16: shift the full mantissa, round to nearest even. */
	man = (abs & 0x7fffffu) | 0x800000u;
	{
		uint32_t shift = 126 - exp; /* 14..24 */
		uint32_t half = 1u << (shift - 1);
		uint32_t rest = man & ((1u << shift) - 1);

		r = man >> shift;
		if (rest > half || (rest == half && (r & 1u)))
			r++;
	}
	return (sign | (uint16_t)r);
}

static inline float
cohort__bf16_to_f32(uint16_t h)
{
	return (half_bits_f32((uint32_t)h << 16));
}

/* Rounds to nearest even, NaN kept quiet; a select rather than a branch,
 * so that the loops calling it vectorise. */
static inline uint16_t
half_f32_to_bf16(float f)
{
	uint32_t u = half_f32_bits(f);
	uint32_t rn = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
	uint32_t qn = (u >> 16) | 0x40u;

	return ((uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? qn : rn));
}

static inline uint16_t
cohort__f32_to_bf16(float f)
{
	return (half_f32_to_bf16(f));
}

#endif /* COHORT_COMMON_HALF_H */
