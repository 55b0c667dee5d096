/*
 * test_token.c - the token chain of common/token.h: job tokens and tenant
 * keys minted from the admin secret, tenants' job tokens minted from
 * their keys (each checked against `openssl dgst -sha256 -hmac`), tenant
 * names, and cohortd's join check (--require-token) in-process: a tenant
 * creates and joins its own jobs, and its key is refused for another
 * tenant's and for names of no tenant.
 */
#include <string.h>

#include "srv_fixture.h"
#include "token.h"
#include "unit_suite.h"

Suite *suite_token(void);

#define ADMIN "adm1n-secret"
/* printf 'cohort-tenant\0%s' team-a | openssl dgst -sha256 -hmac ADMIN */
#define KEY_A                                                                 \
	"20e97ffeb2197758c3a78b868132795399e59e025ae900b26937ec056f611a4e"
#define KEY_B                                                                 \
	"832d0c579dbd839c8363fecd9971387ba4f4137aa0c5c8bd82c5bbf79297ec90"
/* printf %s team-a/train | openssl dgst -sha256 -hmac KEY_A */
#define TOK_A_TRAIN                                                           \
	"3a4b9a3266394960626556bf60552d81cb11d0de295768df127e42e43e534db0"

START_TEST(test_tenant_key_vectors)
{
	char k[COHORT__MINTED_LEN + 1], t[COHORT__MINTED_LEN + 1];

	cohort__tenant_key_mint(ADMIN, "team-a", k);
	ck_assert_str_eq(k, KEY_A);
	cohort__tenant_key_mint(ADMIN, "team-b", k);
	ck_assert_str_eq(k, KEY_B);
	cohort__token_mint(KEY_A, "team-a/train", t);
	ck_assert_str_eq(t, TOK_A_TRAIN);
	/* a tenant's key is not the job token of a job named like the
	 * tenant (the NUL in its message keeps the two apart):
	 * printf %s team-a | openssl dgst -sha256 -hmac ADMIN */
	cohort__token_mint(ADMIN, "team-a", t);
	ck_assert_str_eq(t,
	    "5eaa831d0a80d162cfc82427271a84ccab221379999a381e40217bf1344e2bd"
	    "6");
	ck_assert_str_ne(t, KEY_A);
}
END_TEST

START_TEST(test_tenant_names)
{
	static const char *const good[] = { "a", "team-a", "0", "a-b-c",
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij"
		"abc", /* 63 */
		NULL };
	static const char *const bad[] = { "", "-a", "a-", "Team", "a_b",
		"a/b", "a.b", "a b", "é",
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij"
		"abcd", /* 64 */
		NULL };

	for (int i = 0; good[i] != NULL; i++)
		ck_assert_msg(cohort__tenant_name_ok(good[i]), "%s", good[i]);
	for (int i = 0; bad[i] != NULL; i++)
		ck_assert_msg(!cohort__tenant_name_ok(bad[i]), "%s", bad[i]);
}
END_TEST

START_TEST(test_job_tenant)
{
	char t[COHORT__TENANT_MAX + 1];

	ck_assert(cohort__job_tenant("team-a/train", t, sizeof(t)));
	ck_assert_str_eq(t, "team-a");
	/* the first '/' decides: the rest is the tenant's to name */
	ck_assert(cohort__job_tenant("team-a/x/y", t, sizeof(t)));
	ck_assert_str_eq(t, "team-a");
	ck_assert(!cohort__job_tenant("train", t, sizeof(t)));
	ck_assert_str_eq(t, "");
	ck_assert(!cohort__job_tenant("team-a/", t, sizeof(t)));
	ck_assert(!cohort__job_tenant("/train", t, sizeof(t)));
	ck_assert(!cohort__job_tenant("Team-A/train", t, sizeof(t)));
	ck_assert(!cohort__job_tenant("a_b/train", t, sizeof(t)));
	ck_assert_str_eq(t, "");
	/* out too small for the tenant: no tenant, nothing written past */
	{
		char small[4] = "zzz";
		ck_assert(
		    !cohort__job_tenant("team-a/x", small, sizeof(small)));
		ck_assert_str_eq(small, "");
	}
}
END_TEST

START_TEST(test_is_minted_chain)
{
	char t[COHORT__MINTED_LEN + 1];

	/* the tenant's own job, from its key */
	ck_assert(cohort__token_is_minted(ADMIN, "team-a/train", TOK_A_TRAIN));
	/* the admin may still mint any job's token, a tenant's included */
	cohort__token_mint(ADMIN, "team-a/train", t);
	ck_assert(cohort__token_is_minted(ADMIN, "team-a/train", t));
	/* another tenant's key for team-a's name: refused */
	cohort__token_mint(KEY_B, "team-a/train", t);
	ck_assert(!cohort__token_is_minted(ADMIN, "team-a/train", t));
	/* team-a's token for another of its names, or another tenant's */
	ck_assert(
	    !cohort__token_is_minted(ADMIN, "team-a/other", TOK_A_TRAIN));
	ck_assert(
	    !cohort__token_is_minted(ADMIN, "team-b/train", TOK_A_TRAIN));
	/* a tenant key mints nothing outside TENANT/NAME */
	cohort__token_mint(KEY_A, "train", t);
	ck_assert(!cohort__token_is_minted(ADMIN, "train", t));
	cohort__token_mint(KEY_A, "team-a", t);
	ck_assert(!cohort__token_is_minted(ADMIN, "team-a", t));
	/* the key itself is no token */
	ck_assert(!cohort__token_is_minted(ADMIN, "team-a/train", KEY_A));
	ck_assert(!cohort__token_is_minted(ADMIN, "team-a", KEY_A));
	/* a key minted from another admin secret */
	{
		char k[COHORT__MINTED_LEN + 1];
		cohort__tenant_key_mint("other-secret", "team-a", k);
		cohort__token_mint(k, "team-a/train", t);
		ck_assert(!cohort__token_is_minted(ADMIN, "team-a/train", t));
	}
	/* no admin secret: nothing is minted */
	ck_assert(!cohort__token_is_minted(NULL, "team-a/train", TOK_A_TRAIN));
	ck_assert(!cohort__token_is_minted("", "team-a/train", TOK_A_TRAIN));
	/* one flipped digit */
	memcpy(t, TOK_A_TRAIN, sizeof(t));
	t[0] = t[0] == '0' ? '1' : '0';
	ck_assert(!cohort__token_is_minted(ADMIN, "team-a/train", t));
}
END_TEST

/* cohortd --require-token, in-process: tenant team-a holds only its key;
 * it creates and joins team-a/train, and is refused on team-b's name, on
 * a name of no tenant, and with its key as the token. The refusal says
 * which tenant's key is needed and creates nothing. */
START_TEST(test_join_tenant_jobs)
{
	struct srq_cli a, b, x;
	char tok[COHORT__MINTED_LEN + 1];
	Cohort__Reply *r;

	f->core->admin_token = strdup(ADMIN);
	f->core->require_token = true;
	/* team-a's key on team-b's name */
	srq_cli_init(&x, "team-b/train", 1, 1);
	cohort__token_mint(KEY_A, "team-b/train", tok);
	x.token = tok;
	r = fx_want(f, fx_join(f, &x, 0, 1, 1000), COHORT_EAUTH);
	ck_assert_ptr_nonnull(strstr(r->error, "job 'team-b/train'"));
	ck_assert_ptr_nonnull(strstr(r->error, "tenant 'team-b'"));
	ck_assert_ptr_nonnull(strstr(r->error, "--tenant-key-file"));
	/* team-a's key on a name of no tenant, and the key as a token */
	srq_cli_init(&x, "train", 2, 2);
	cohort__token_mint(KEY_A, "train", tok);
	x.token = tok;
	r = fx_want(f, fx_join(f, &x, 0, 1, 1000), COHORT_EAUTH);
	ck_assert_ptr_nonnull(strstr(r->error, "cohort token train"));
	srq_cli_init(&x, "team-a/train", 3, 3);
	x.token = KEY_A;
	fx_want(f, fx_join(f, &x, 0, 1, 1000), COHORT_EAUTH);
	ck_assert_uint_eq(f->core->jobs.n, 0);
	/* team-a's own job: created by its first rank, joined by the next */
	srq_cli_init(&a, "team-a/train", 4, 4);
	srq_cli_init(&b, "team-a/train", 5, 5);
	a.token = b.token = TOK_A_TRAIN;
	{
		uintptr_t ta = fx_join(f, &a, 0, 2, 60000);
		uintptr_t tb = fx_join(f, &b, 1, 2, 60000);
		fx_joined(f, &a, ta);
		fx_joined(f, &b, tb);
	}
	fx_want(f, fx_kv_set(f, &a, "k", "v"), COHORT_OK);
	ck_assert_uint_eq(f->core->jobs.n, 1);
	/* team-b, with its own key, cannot touch it once it exists */
	srq_cli_init(&x, "team-a/train", 6, 6);
	cohort__token_mint(KEY_B, "team-a/train", tok);
	x.token = tok;
	fx_want(f, fx_kv_set(f, &x, "k", "w"), COHORT_EAUTH);
	fx_want(f, fx_join(f, &x, 0, 2, 1000), COHORT_EAUTH);
	/* and runs its own */
	srq_cli_init(&x, "team-b/train", 7, 7);
	cohort__token_mint(KEY_B, "team-b/train", tok);
	x.token = tok;
	fx_joined(f, &x, fx_join(f, &x, 0, 1, 60000));
	ck_assert_uint_eq(f->core->jobs.n, 2);
}
END_TEST

UNIT_FIXTURE_SUITE(token, "token", 30, fx_setup, fx_teardown,
    test_tenant_key_vectors, test_tenant_names, test_job_tenant,
    test_is_minted_chain, test_join_tenant_jobs)
