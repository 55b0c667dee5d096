/*
 * test_status.c - status names and texts, dtype and redop tables.
 */
#include <string.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "cohort_impl.h"

Suite *suite_status(void);

static const struct {
	cohort_status st;
	const char *name;
	const char *msg;
} status_table[] = {
#define COHORT__XX(name, code, msg) { COHORT_##name, "COHORT_" #name, msg },
	COHORT_STATUS_MAP(COHORT__XX)
#undef COHORT__XX
};

#define NSTATUS (sizeof(status_table) / sizeof(status_table[0]))

START_TEST(test_every_code_has_name_and_text)
{
	for (size_t i = 0; i < NSTATUS; i++) {
		ck_assert_str_eq(cohort_status_name(status_table[i].st),
		    status_table[i].name);
		ck_assert_str_eq(
		    cohort_strerror(status_table[i].st), status_table[i].msg);
		ck_assert_uint_gt(
		    strlen(cohort_strerror(status_table[i].st)), 0);
	}
}
END_TEST

START_TEST(test_codes_are_dense_and_stable)
{
	/* wire values: append only */
	ck_assert_int_eq(COHORT_OK, 0);
	ck_assert_int_eq(COHORT_ETIMEDOUT, 3);
	ck_assert_int_eq(COHORT_EPEERLOST, 6);
	ck_assert_int_eq(COHORT_ENOCOORD, 20);
	for (size_t i = 0; i < NSTATUS; i++)
		ck_assert_int_eq(status_table[i].st, (int)i);
}
END_TEST

START_TEST(test_names_are_unique)
{
	for (size_t i = 0; i < NSTATUS; i++)
		for (size_t j = i + 1; j < NSTATUS; j++)
			ck_assert_str_ne(
			    status_table[i].name, status_table[j].name);
}
END_TEST

START_TEST(test_unknown_code)
{
	ck_assert_str_eq(
	    cohort_status_name((cohort_status)9999), "COHORT_UNKNOWN");
	ck_assert_str_eq(
	    cohort_strerror((cohort_status)9999), "unknown cohort status");
	ck_assert_ptr_nonnull(cohort_strerror((cohort_status)-1));
	ck_assert_ptr_nonnull(cohort_status_name((cohort_status)-1));
}
END_TEST

START_TEST(test_dtype_sizes_and_names)
{
	/* every dtype, then the first past the end and two out of range */
	static const struct {
		cohort_dtype dt;
		size_t size;
		const char *name;
	} want[] = { { COHORT_F32, 4, "f32" }, { COHORT_F64, 8, "f64" },
		{ COHORT_F16, 2, "f16" }, { COHORT_BF16, 2, "bf16" },
		{ COHORT_I32, 4, "i32" }, { COHORT_I64, 8, "i64" },
		{ COHORT_U8, 1, "u8" }, { COHORT_DTYPE_COUNT, 0, "invalid" },
		{ (cohort_dtype)-1, 0, "invalid" },
		{ (cohort_dtype)77, 0, "invalid" } };

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		ck_assert_uint_eq(cohort_dtype_size(want[i].dt), want[i].size);
		ck_assert_str_eq(cohort_dtype_name(want[i].dt), want[i].name);
	}
}
END_TEST

START_TEST(test_redop_names)
{
	ck_assert_str_eq(cohort_redop_name(COHORT_SUM), "sum");
	ck_assert_str_eq(cohort_redop_name(COHORT_PROD), "prod");
	ck_assert_str_eq(cohort_redop_name(COHORT_MIN), "min");
	ck_assert_str_eq(cohort_redop_name(COHORT_MAX), "max");
	ck_assert_str_eq(cohort_redop_name(COHORT_MEAN), "mean");
	ck_assert_str_eq(cohort_redop_name(COHORT_REDOP_COUNT), "invalid");
}
END_TEST

START_TEST(test_err_returns_status_and_keeps_detail)
{
	char big[COHORT__DETAIL_MAX + 1000];

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	ck_assert_int_eq(cohort__err(COHORT_EAUTH, "%s", big), COHORT_EAUTH);
	/* truncated, NUL-terminated */
	ck_assert_uint_lt(strlen(cohort_last_error()), sizeof(big) - 1);
	ck_assert_uint_eq(strlen(cohort_last_error()), COHORT__DETAIL_MAX - 1);
}
END_TEST

START_TEST(test_from_nng)
{
	ck_assert_int_eq(cohort__from_nng(0), COHORT_OK);
	ck_assert_int_eq(cohort__from_nng(NNG_ETIMEDOUT), COHORT_ETIMEDOUT);
	ck_assert_int_eq(cohort__from_nng(NNG_ECONNREFUSED), COHORT_ENOCOORD);
	ck_assert_int_eq(cohort__from_nng(NNG_EMSGSIZE), COHORT_ETOOBIG);
	ck_assert_int_eq(cohort__from_nng(NNG_ENOMEM), COHORT_ENOMEM);
	ck_assert_int_eq(cohort__from_nng(NNG_ECLOSED), COHORT_ECLOSED);
	ck_assert_int_eq(cohort__from_nng(NNG_EINTERNAL), COHORT_ETRANSPORT);
}
END_TEST

UNIT_SUITE(status, "status", 30, test_every_code_has_name_and_text,
    test_codes_are_dense_and_stable, test_names_are_unique, test_unknown_code,
    test_dtype_sizes_and_names, test_redop_names,
    test_err_returns_status_and_keeps_detail, test_from_nng)
