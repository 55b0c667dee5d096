/*
 * knobs.c - the environment, read in one place (knobs.h).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cohort_common.h"
#include "knobs.h"

static const struct cohort__knob_info knobs[COHORT__KNOB_COUNT] = {
#define COHORT__KNOB_ROW(id, type, dflt, min, max, group, doc)                \
	[COHORT__KNOB_##id] = { "COHORT_" #id, COHORT__KNOB_##type, dflt,     \
		min, max, group, doc },
	COHORT__KNOBS(COHORT__KNOB_ROW)
#undef COHORT__KNOB_ROW
};

/* One warning per knob for a bad tuning value. */
static atomic_uint_fast64_t knobs_warned;

const struct cohort__knob_info *
cohort__knob_info(enum cohort__knob k)
{
	return ((unsigned)k < COHORT__KNOB_COUNT ? &knobs[k] : NULL);
}

const char *
cohort__env_raw(const char *name)
{
	const char *s = name != NULL ? getenv(name) : NULL;

	return (s != NULL && s[0] != '\0' ? s : NULL);
}

const char *
cohort__knob_str(enum cohort__knob k)
{
	if ((unsigned)k >= COHORT__KNOB_COUNT)
		return (NULL);
	return (cohort__env_raw(knobs[k].name));
}

cohort_status
cohort__knob_int(enum cohort__knob k, int64_t *out, bool *set)
{
	const struct cohort__knob_info *in = cohort__knob_info(k);
	const char *s = cohort__knob_str(k);
	int64_t v;

	*set = false;
	if (in == NULL || s == NULL)
		return (COHORT_OK);
	if (in->type == COHORT__KNOB_BOOL) {
		if (strcmp(s, "0") != 0 && strcmp(s, "1") != 0)
			return (cohort__err(COHORT_EINVAL,
			    "%s='%s' is not 0 or 1", in->name, s));
		*out = s[0] == '1';
		*set = true;
		return (COHORT_OK);
	}
	if (s[0] == ' ' || s[0] == '\t' || !cohort__parse_i64(s, &v))
		return (cohort__err(COHORT_EINVAL, "%s='%s' is not %s",
		    in->name, s,
		    in->type == COHORT__KNOB_MS ? "a duration in milliseconds"
		        : in->type == COHORT__KNOB_BYTES ? "a size in bytes"
		                                         : "an integer"));
	if (v < in->min || v > in->max)
		return (cohort__err(COHORT_EINVAL,
		    "%s=%s is out of range [%lld, %lld]", in->name, s,
		    (long long)in->min, (long long)in->max));
	*out = v;
	*set = true;
	return (COHORT_OK);
}

static void
knobs_warn_once(enum cohort__knob k, const char *why)
{
	uint_fast64_t bit = (uint_fast64_t)1 << ((unsigned)k % 64);

	if ((atomic_fetch_or(&knobs_warned, bit) & bit) == 0)
		cohort__warn("%s: %s; using the default", knobs[k].name, why);
}

int64_t
cohort__knob_int_or(enum cohort__knob k, int64_t dflt)
{
	int64_t v;
	bool set;

	if (cohort__knob_int(k, &v, &set) != COHORT_OK) {
		knobs_warn_once(k, cohort_last_error());
		return (dflt);
	}
	return (set ? v : dflt);
}

double
cohort__knob_float_or(enum cohort__knob k, double dflt)
{
	const struct cohort__knob_info *in = cohort__knob_info(k);
	const char *s = cohort__knob_str(k);
	char *end;
	double f;

	if (in == NULL || s == NULL)
		return (dflt);
	errno = 0;
	f = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !(f > (double)in->min)
	    || f > (double)in->max) {
		knobs_warn_once(k, "not a number in range");
		return (dflt);
	}
	return (f);
}
