/*
 * fault.c - the fault schedule: parser, deterministic resolution, and the
 * client's injection points (see fault.h; docs/fault-injection.md).
 *
 * Every injection is written before it acts: one line on stderr
 * ("cohort fault: seed=42 rank=2 op=100 action=kill ...") and, with
 * COHORT_FAULTS_LOG=PATH, one JSON line appended to PATH (O_APPEND, one
 * write per line, so the ranks of a job may share the file). The fields
 * before "pid" are deterministic for operation triggers: two runs with the
 * same seed and program give the same lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "fault.h"

/* Rules one client keeps (environment plus `cohort fault`). */
#define FAULT_MAX_LIVE 256

/* ------------------------------------------------------------------------ */
/* Parser                                                                   */
/* ------------------------------------------------------------------------ */

/* A slice of the spec. */
struct fault_tok {
	const char *p;
	size_t n;
};

static struct fault_tok
fault_trim(const char *p, size_t n)
{
	struct fault_tok t;

	while (
	    n > 0 && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
		p++;
		n--;
	}
	while (n > 0
	    && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\n'
	        || p[n - 1] == '\r'))
		n--;
	t.p = p;
	t.n = n;
	return (t);
}

static bool
fault_eq(struct fault_tok t, const char *s)
{
	return (t.n == strlen(s) && memcmp(t.p, s, t.n) == 0);
}

static bool
fault_prefix(struct fault_tok *t, const char *s)
{
	size_t n = strlen(s);

	if (t->n < n || memcmp(t->p, s, n) != 0)
		return (false);
	t->p += n;
	t->n -= n;
	return (true);
}

static bool
fault_u64(struct fault_tok t, uint64_t *out)
{
	uint64_t v = 0;

	if (t.n == 0 || t.n > 19)
		return (false);
	for (size_t i = 0; i < t.n; i++) {
		if (t.p[i] < '0' || t.p[i] > '9')
			return (false);
		v = v * 10 + (uint64_t)(t.p[i] - '0');
	}
	*out = v;
	return (true);
}

/* N, Nms, Ns, Nm -> milliseconds. */
static bool
fault_dur(struct fault_tok t, uint64_t *ms)
{
	uint64_t mult = 1, v;
	size_t n = t.n;

	if (n > 2 && memcmp(t.p + n - 2, "ms", 2) == 0)
		n -= 2;
	else if (n > 1 && t.p[n - 1] == 's')
		mult = 1000, n--;
	else if (n > 1 && t.p[n - 1] == 'm')
		mult = 60000, n--;
	t.n = n;
	if (!fault_u64(t, &v) || v > UINT64_C(1) << 40)
		return (false);
	*ms = v * mult;
	return (true);
}

/* "LO-HI" with a per-bound parser. */
static bool
fault_range(struct fault_tok t, bool dur, uint64_t *lo, uint64_t *hi)
{
	const char *dash = memchr(t.p, '-', t.n);
	struct fault_tok a, b;

	if (dash == NULL)
		return (false);
	a = fault_trim(t.p, (size_t)(dash - t.p));
	b = fault_trim(dash + 1, t.n - (size_t)(dash - t.p) - 1);
	if (dur ? !fault_dur(a, lo) || !fault_dur(b, hi)
	        : !fault_u64(a, lo) || !fault_u64(b, hi))
		return (false);
	return (*lo <= *hi);
}

static cohort_status
fault_bad(struct fault_tok item, const char *what)
{
	return (
	    cohort__err(COHORT_EINVAL, "fault schedule: bad item '%.*s': %s",
	        (int)(item.n > 200 ? 200 : item.n), item.p, what));
}

static cohort_status
fault_parse_at(
    struct fault_tok item, struct fault_tok v, struct cohort__fault_rule *r)
{
	bool dur;

	if (fault_prefix(&v, "op:"))
		r->trigger = COHORT__FAULT_AT_OP, dur = false;
	else if (fault_prefix(&v, "time:"))
		r->trigger = COHORT__FAULT_AT_TIME, dur = true;
	else
		return (fault_bad(item,
		    "at= must be op:N, op:+N, op:random:LO-HI, time:T, "
		    "time:+T or time:random:LO-HI (T like 500ms, 5s, 2m)"));
	if (fault_prefix(&v, "random:")) {
		r->random_at = true;
		if (!fault_range(v, dur, &r->at_lo, &r->at_hi))
			return (fault_bad(item,
			    "random: needs a range LO-HI with LO <= HI"));
		if (!dur && r->at_lo == 0)
			return (
			    fault_bad(item, "operations are counted from 1"));
		return (COHORT_OK);
	}
	if (fault_prefix(&v, "+"))
		r->relative = true;
	if (dur ? !fault_dur(v, &r->at) : !fault_u64(v, &r->at))
		return (fault_bad(item,
		    dur ? "time needs a duration like 500ms, 5s or 2m"
		        : "op needs an operation number"));
	if (!dur && !r->relative && r->at == 0)
		return (fault_bad(item, "operations are counted from 1"));
	return (COHORT_OK);
}

/* A word of a field's value and what it stands for. */
struct fault_kw {
	const char *word;
	int32_t value;
};

/* The value of word v in kw[0..n) into *out; false if v is none of
 * them. */
static bool
fault_keyword(
    struct fault_tok v, const struct fault_kw *kw, size_t n, int32_t *out)
{
	for (size_t i = 0; i < n; i++) {
		if (fault_eq(v, kw[i].word)) {
			*out = kw[i].value;
			return (true);
		}
	}
	return (false);
}

static const struct fault_kw fault_action_words[] = {
	{ "kill", COHORT__FAULT_KILL }, { "stop", COHORT__FAULT_STOP },
	{ "drop", COHORT__FAULT_DROP }, { "fail", COHORT__FAULT_FAIL },
	{ "exit", COHORT__FAULT_EXIT }, /* with COHORT__FAULT_EXIT_CODE */
};

static const struct fault_kw fault_rank_words[] = {
	{ "random", COHORT__FAULT_RANK_RANDOM },
	{ "all", COHORT__FAULT_RANK_ALL },
	{ "*", COHORT__FAULT_RANK_ALL },
};

static const struct fault_kw fault_run_words[] = {
	{ "any", COHORT__FAULT_RUN_ANY },
	{ "*", COHORT__FAULT_RUN_ANY },
};

#define FAULT_NWORDS(kw) (sizeof(kw) / sizeof((kw)[0]))

static cohort_status
fault_parse_action(
    struct fault_tok item, struct fault_tok v, struct cohort__fault_rule *r)
{
	uint64_t x;
	int32_t a;

	if (fault_keyword(
	        v, fault_action_words, FAULT_NWORDS(fault_action_words), &a)) {
		r->action = (enum cohort__fault_action)a;
		if (r->action == COHORT__FAULT_EXIT)
			r->arg = COHORT__FAULT_EXIT_CODE;
	} else if (fault_prefix(&v, "exit:")) {
		r->action = COHORT__FAULT_EXIT;
		if (!fault_u64(v, &x) || x > 255)
			return (fault_bad(item, "exit code must be 0..255"));
		r->arg = (int64_t)x;
	} else if (fault_prefix(&v, "delay:")) {
		r->action = COHORT__FAULT_DELAY;
		if (!fault_dur(v, &x) || x > 3600000)
			return (fault_bad(item,
			    "delay needs a duration up to 1 h, like 200ms"));
		r->arg = (int64_t)x;
	} else {
		return (fault_bad(item,
		    "action= must be exit[:CODE], kill, stop, delay:DUR, "
		    "drop or fail"));
	}
	return (COHORT_OK);
}

/* A field's value v: one of the words kw[0..n), or a number below max;
 * into *out, else EINVAL saying why. */
static cohort_status
fault_word_or_number(struct fault_tok item, struct fault_tok v,
    const struct fault_kw *kw, size_t n, uint64_t max, int32_t *out,
    const char *why)
{
	uint64_t x;

	if (fault_keyword(v, kw, n, out))
		return (COHORT_OK);
	if (!fault_u64(v, &x) || x >= max)
		return (fault_bad(item, why));
	*out = (int32_t)x;
	return (COHORT_OK);
}

static cohort_status
fault_parse_rank(
    struct fault_tok item, struct fault_tok v, struct cohort__fault_rule *r)
{
	return (fault_word_or_number(item, v, fault_rank_words,
	    FAULT_NWORDS(fault_rank_words), 1u << 24, &r->rank,
	    "rank= must be a rank, random or all"));
}

/* The fields every rule has, each once: their parsers, in the order in
 * which a missing one is reported. */
static const struct {
	const char *name;
	cohort_status (*parse)(
	    struct fault_tok, struct fault_tok, struct cohort__fault_rule *);
} fault_required[] = {
	{ "rank", fault_parse_rank },
	{ "at", fault_parse_at },
	{ "action", fault_parse_action },
};

#define FAULT_NREQUIRED (sizeof(fault_required) / sizeof(fault_required[0]))

/* The index of field k in fault_required; FAULT_NREQUIRED if none. */
static size_t
fault_required_find(struct fault_tok k)
{
	size_t j = 0;

	while (j < FAULT_NREQUIRED && !fault_eq(k, fault_required[j].name))
		j++;
	return (j);
}

/* fault_bad with "<field><what>" ("rank given twice", "at= is missing"). */
static cohort_status
fault_bad_field(struct fault_tok item, size_t field, const char *what)
{
	char why[64];

	snprintf(why, sizeof(why), "%s%s", fault_required[field].name, what);
	return (fault_bad(item, why));
}

static cohort_status
fault_parse_rule(struct fault_tok item, struct cohort__fault_rule *r)
{
	unsigned seen = 0; /* bit j: fault_required[j] given */
	bool has_count = false;
	size_t i = 0, j;
	uint64_t x;
	cohort_status st;

	memset(r, 0, sizeof(*r));
	r->count = 1;
	r->run = 0;
	while (i <= item.n) {
		const char *end = memchr(item.p + i, ',', item.n - i);
		size_t flen
		    = end != NULL ? (size_t)(end - (item.p + i)) : item.n - i;
		struct fault_tok f = fault_trim(item.p + i, flen), k, v;
		const char *eq = memchr(f.p, '=', f.n);

		i += flen + 1;
		if (f.n == 0)
			return (fault_bad(item, "empty field"));
		if (eq == NULL)
			return (fault_bad(item,
			    "fields are key=value (rank, at, action, count, "
			    "run)"));
		k = fault_trim(f.p, (size_t)(eq - f.p));
		v = fault_trim(eq + 1, f.n - (size_t)(eq - f.p) - 1);
		if ((j = fault_required_find(k)) < FAULT_NREQUIRED) {
			if ((seen & (1u << j)) != 0)
				return (
				    fault_bad_field(item, j, " given twice"));
			seen |= 1u << j;
			if ((st = fault_required[j].parse(item, v, r))
			    != COHORT_OK)
				return (st);
		} else if (fault_eq(k, "count")) {
			if (!fault_u64(v, &x) || x < 1 || x > 1000000)
				return (fault_bad(
				    item, "count= must be 1..1000000"));
			has_count = true;
			r->count = (uint32_t)x;
		} else if (fault_eq(k, "run")) {
			if ((st = fault_word_or_number(item, v,
			         fault_run_words,
			         FAULT_NWORDS(fault_run_words), INT32_MAX,
			         &r->run,
			         "run= must be a restart count or any"))
			    != COHORT_OK)
				return (st);
		} else {
			return (fault_bad(item,
			    "unknown field (rank, at, action, count, run)"));
		}
	}
	for (j = 0; j < FAULT_NREQUIRED; j++)
		if ((seen & (1u << j)) == 0)
			return (fault_bad_field(item, j, "= is missing"));
	if (has_count && r->action != COHORT__FAULT_DELAY)
		return (
		    fault_bad(item, "count= applies to action=delay only"));
	return (COHORT_OK);
}

cohort_status
cohort__fault_parse(const char *spec, struct cohort__fault_plan *plan)
{
	size_t len, i = 0;
	bool seed_seen = false;
	cohort_status st;

	memset(plan, 0, sizeof(*plan));
	if (spec == NULL)
		return (COHORT_OK);
	len = strlen(spec);
	while (i <= len) {
		const char *end = memchr(spec + i, ';', len - i);
		size_t ilen
		    = end != NULL ? (size_t)(end - (spec + i)) : len - i;
		struct fault_tok item = fault_trim(spec + i, ilen), v = item;

		i += ilen + 1;
		if (item.n == 0)
			continue;
		if (fault_prefix(&v, "seed=")) {
			if (seed_seen)
				return (fault_bad(item, "seed given twice"));
			if (!fault_u64(fault_trim(v.p, v.n), &plan->seed))
				return (fault_bad(item,
				    "seed= must be an unsigned integer"));
			seed_seen = plan->seed_given = true;
			continue;
		}
		if (plan->n == COHORT__FAULT_MAX_RULES)
			return (cohort__err(COHORT_EINVAL,
			    "fault schedule: more than %d rules",
			    COHORT__FAULT_MAX_RULES));
		if ((st = fault_parse_rule(item, &plan->rules[plan->n]))
		    != COHORT_OK)
			return (st);
		plan->n++;
	}
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Resolution and format                                                    */
/* ------------------------------------------------------------------------ */

static uint64_t
fault_mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (z ^ (z >> 31));
}

cohort_status
cohort__fault_resolve(
    struct cohort__fault_plan *plan, uint64_t dflt_seed, int32_t world)
{
	if (!plan->seed_given && !plan->resolved)
		plan->seed = dflt_seed;
	for (size_t i = 0; i < plan->n; i++) {
		struct cohort__fault_rule *r = &plan->rules[i];
		/* one stream per rule: adding a rule does not move others */
		uint64_t s = fault_mix(plan->seed ^ fault_mix(i + 1));

		if (r->rank == COHORT__FAULT_RANK_RANDOM) {
			r->rank = (int32_t)(s % (uint64_t)world);
			s = fault_mix(s);
		} else if (r->rank >= world) {
			return (cohort__err(COHORT_EINVAL,
			    "fault schedule: rule %zu names rank %d, but the "
			    "job has %d ranks",
			    i + 1, r->rank, world));
		}
		if (r->random_at) {
			r->at = r->at_lo + s % (r->at_hi - r->at_lo + 1);
			r->random_at = false;
		}
	}
	plan->resolved = true;
	return (COHORT_OK);
}

static const char *const fault_action_names[] = {
	[COHORT__FAULT_EXIT] = "exit",
	[COHORT__FAULT_KILL] = "kill",
	[COHORT__FAULT_STOP] = "stop",
	[COHORT__FAULT_DELAY] = "delay",
	[COHORT__FAULT_DROP] = "drop",
	[COHORT__FAULT_FAIL] = "fail",
};

const char *
cohort__fault_action_name(enum cohort__fault_action a)
{
	if ((size_t)a
	    >= sizeof(fault_action_names) / sizeof(fault_action_names[0]))
		return ("?");
	return (fault_action_names[a]);
}

size_t
cohort__fault_format_rule(
    const struct cohort__fault_rule *r, char *buf, size_t len)
{
	size_t off = 0;
	const char *unit = r->trigger == COHORT__FAULT_AT_TIME ? "ms" : "";

	if (len > 0)
		buf[0] = '\0';
	if (r->rank == COHORT__FAULT_RANK_RANDOM)
		cohort__appendf(buf, len, &off, "rank=random");
	else if (r->rank == COHORT__FAULT_RANK_ALL)
		cohort__appendf(buf, len, &off, "rank=all");
	else
		cohort__appendf(buf, len, &off, "rank=%d", r->rank);
	cohort__appendf(buf, len, &off,
	    ",at=%s:", r->trigger == COHORT__FAULT_AT_OP ? "op" : "time");
	if (r->random_at)
		cohort__appendf(buf, len, &off,
		    "random:%" PRIu64 "%s-%" PRIu64 "%s", r->at_lo, unit,
		    r->at_hi, unit);
	else
		cohort__appendf(buf, len, &off, "%s%" PRIu64 "%s",
		    r->relative ? "+" : "", r->at, unit);
	cohort__appendf(buf, len, &off, ",action=%s",
	    cohort__fault_action_name(r->action));
	if (r->action == COHORT__FAULT_EXIT)
		cohort__appendf(buf, len, &off, ":%" PRId64, r->arg);
	if (r->action == COHORT__FAULT_DELAY)
		cohort__appendf(buf, len, &off, ":%" PRId64 "ms", r->arg);
	if (r->count > 1)
		cohort__appendf(buf, len, &off, ",count=%u", r->count);
	if (r->run == COHORT__FAULT_RUN_ANY)
		cohort__appendf(buf, len, &off, ",run=any");
	else if (r->run != 0)
		cohort__appendf(buf, len, &off, ",run=%d", r->run);
	return (off);
}

size_t
cohort__fault_format(
    const struct cohort__fault_plan *plan, char *buf, size_t len)
{
	size_t off = 0;
	char rb[256];

	if (len > 0)
		buf[0] = '\0';
	cohort__appendf(buf, len, &off, "seed=%" PRIu64, plan->seed);
	for (size_t i = 0; i < plan->n; i++) {
		cohort__fault_format_rule(&plan->rules[i], rb, sizeof(rb));
		cohort__appendf(buf, len, &off, ";%s", rb);
	}
	return (off);
}

/* ------------------------------------------------------------------------ */
/* Client side                                                              */
/* ------------------------------------------------------------------------ */

struct fault_live {
	struct cohort__fault_rule r;
	uint64_t seed;
	unsigned schedule; /* 0: COHORT_FAULTS, n: `cohort fault` #n */
	unsigned idx; /* rule number in its schedule, from 1 */
	uint64_t op_at; /* AT_OP: absolute operation number */
	cohort__time time_at; /* AT_TIME: absolute monotonic ms */
	bool armed; /* AT_TIME delay/fail: due at the next op */
	bool done;
	uint32_t left; /* delay: operations still to delay */
};

struct cohort__fault {
	struct cohort__fault_hooks hooks; /* the client's, from fault_open */
	/* Who this is (from fault_start): a copy, so that nothing here
	 * reads the client; m.job points to job. */
	struct cohort__fault_member m;
	char job[COHORT__FAULT_JOB_MAX];
	pthread_mutex_t mtx;
	_Atomic uint64_t ops; /* operations entered */
	atomic_int pending; /* live rules not done */
	struct cohort__fault_plan env; /* COHORT_FAULTS as parsed */
	bool have_env;
	int32_t restart;
	cohort__time t0; /* open */
	struct fault_live live[FAULT_MAX_LIVE];
	size_t nlive;
	char log_path[512];

	nng_aio *timer; /* next time trigger */
	struct cohort__coord_async *poll;
	uint64_t poll_next; /* next __cohort/faults/N */
	bool stopping; /* under mtx */
};

static void fault_arm_timer_locked(struct cohort__fault *f);

/* One audit record: stderr line, and a JSON line to COHORT_FAULTS_LOG. */
static void
fault_audit(struct cohort__fault *f, const struct fault_live *l, uint64_t op,
    const char *kind, const char *group, uint64_t seq)
{
	char rule[256], line[1024], trig[64];
	size_t off = 0;
	int fd;

	cohort__fault_format_rule(&l->r, rule, sizeof(rule));
	if (l->r.trigger == COHORT__FAULT_AT_OP)
		snprintf(trig, sizeof(trig), "op:%" PRIu64, l->op_at);
	else
		snprintf(trig, sizeof(trig), "time:%" PRId64 "ms",
		    (int64_t)(l->time_at - f->t0));
	fprintf(stderr,
	    "cohort fault: seed=%" PRIu64 " rank=%d op=%" PRIu64
	    " action=%s (schedule %u rule %u: %s; in %s #%" PRIu64
	    " on group '%s')\n",
	    l->seed, f->m.rank, op, cohort__fault_action_name(l->r.action),
	    l->schedule, l->idx, rule, kind != NULL ? kind : "-", seq,
	    group != NULL ? group : "");
	fflush(stderr);
	if (f->log_path[0] == '\0')
		return;
	cohort__appendf(line, sizeof(line), &off,
	    "{\"cohort_fault\":\"inject\",\"seed\":%" PRIu64
	    ",\"schedule\":%u,\"rule\":%u,\"rank\":%d,\"at\":\"%s\","
	    "\"action\":\"%s\",\"arg\":%" PRId64 ",\"spec\":\"%s\"",
	    l->seed, l->schedule, l->idx, f->m.rank, trig,
	    cohort__fault_action_name(l->r.action), l->r.arg, rule);
	if (l->r.trigger == COHORT__FAULT_AT_OP)
		cohort__appendf(line, sizeof(line), &off,
		    ",\"op\":%" PRIu64 ",\"kind\":\"%s\",\"group\":\"%s\","
		    "\"seq\":%" PRIu64,
		    op, kind != NULL ? kind : "", group != NULL ? group : "",
		    seq);
	cohort__appendf(line, sizeof(line), &off,
	    ",\"job\":\"%s\",\"generation\":%" PRIu64 ",\"restart\":%d"
	    ",\"pid\":%d,\"t_ms\":%" PRId64 ",\"wall_ms\":%" PRIu64 "}\n",
	    f->job, f->m.generation, f->restart, (int)getpid(),
	    (int64_t)(cohort__now_ms() - f->t0), cohort__wall_ms());
	if ((fd = open(
	         f->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644))
	    < 0) {
		cohort__warn("cannot append to COHORT_FAULTS_LOG=%s: %s",
		    f->log_path, strerror(errno));
		return;
	}
	if (write(fd, line, strlen(line)) < 0)
		cohort__warn("writing COHORT_FAULTS_LOG=%s: %s", f->log_path,
		    strerror(errno));
	close(fd);
}

/* action=kill and action=stop: what is buffered goes out first (the
 * audit line, the process's own output), then the signal. */
static void
fault_do_signal(int sig)
{
	fflush(NULL);
	raise(sig);
}

/* Ends the process the way action=exit says: tells cohortd why (so the
 * peers' EPEERLOST and the launcher's report carry it), then _exit. */
static void
fault_do_exit(struct cohort__fault *f, const char *text, int code,
    const char *kind, const char *group, uint64_t seq)
{
	fprintf(stderr, "cohort fault: %s (exit %d)\n", text, code);
	fflush(NULL);
	/* the operation it dies in, for cohortd's record and the report */
	if (kind != NULL)
		f->hooks.heartbeat_now(f->hooks.ctx, kind, group, seq);
	(void)f->hooks.report(f->hooks.ctx, text, 2000);
	fflush(NULL);
	_exit(code);
}

/* action=drop: the data plane and the coordinator connection go. */
static void
fault_do_drop(struct cohort__fault *f, const char *text)
{
	f->hooks.fail(f->hooks.ctx, COHORT_EINJECTED, text);
	cohort__coord_drop(f->m.coord, text);
}

struct fault_job {
	struct cohort__fault *f;
	enum cohort__fault_action action;
	int code;
	char text[256];
};

static void *
fault_job_main(void *arg)
{
	struct fault_job *j = arg;

	if (j->action == COHORT__FAULT_EXIT)
		fault_do_exit(j->f, j->text, j->code, NULL, NULL, 0);
	else
		fault_do_drop(j->f, j->text);
	free(j);
	return (NULL);
}

/* exit/drop fired by the timer: off nng's thread (they make calls). */
static void
fault_spawn(struct cohort__fault *f, enum cohort__fault_action a, int code,
    const char *text)
{
	struct fault_job *j = calloc(1, sizeof(*j));
	pthread_attr_t attr;
	pthread_t tid;

	if (j == NULL) {
		if (a == COHORT__FAULT_EXIT)
			_exit(code);
		return;
	}
	j->f = f;
	j->action = a;
	j->code = code;
	cohort__strlcpy(j->text, text, sizeof(j->text));
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&tid, &attr, fault_job_main, j) != 0) {
		free(j);
		if (a == COHORT__FAULT_EXIT)
			_exit(code);
	}
	pthread_attr_destroy(&attr);
}

static bool
fault_sleep_ms(int64_t ms)
{
	struct timespec ts;

	ts.tv_sec = (time_t)(ms / 1000);
	ts.tv_nsec = (long)(ms % 1000) * 1000000L;
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
	return (true);
}

cohort_status
cohort__fault_point(
    struct cohort__fault *f, const char *group, const char *kind, uint64_t seq)
{
	struct fault_live due[8];
	size_t ndue = 0;
	uint64_t n;
	cohort_status st = COHORT_OK;
	char text[512];

	if (f == NULL)
		return (COHORT_OK);
	n = atomic_fetch_add_explicit(&f->ops, 1, memory_order_relaxed) + 1;
	if (atomic_load_explicit(&f->pending, memory_order_acquire) == 0)
		return (COHORT_OK);
	pthread_mutex_lock(&f->mtx);
	for (size_t i = 0; i < f->nlive && ndue < 8; i++) {
		struct fault_live *l = &f->live[i];

		if (l->done
		    || (l->r.trigger == COHORT__FAULT_AT_OP ? n < l->op_at
		                                            : !l->armed))
			continue;
		due[ndue++] = *l;
		if (l->r.action == COHORT__FAULT_DELAY && --l->left > 0)
			continue;
		l->done = true;
		atomic_fetch_sub(&f->pending, 1);
	}
	pthread_mutex_unlock(&f->mtx);

	for (size_t i = 0; i < ndue; i++) {
		struct fault_live *l = &due[i];
		size_t off = 0;

		fault_audit(f, l, n, kind, group, seq);
		cohort__appendf(text, sizeof(text), &off,
		    "injected fault: %s at op %" PRIu64 " (%s #%" PRIu64
		    " on group '%s'; seed=%" PRIu64 ", schedule %u rule %u)",
		    cohort__fault_action_name(l->r.action), n, kind, seq,
		    group, l->seed, l->schedule, l->idx);
		switch (l->r.action) {
		case COHORT__FAULT_KILL:
			fault_do_signal(SIGKILL);
			break;
		case COHORT__FAULT_EXIT:
			fault_do_exit(
			    f, text, (int)l->r.arg, kind, group, seq);
			break;
		case COHORT__FAULT_STOP:
			fault_do_signal(SIGSTOP);
			break;
		case COHORT__FAULT_DELAY:
			fault_sleep_ms(l->r.arg);
			break;
		case COHORT__FAULT_DROP:
			fault_do_drop(f, text);
			st = COHORT_EINJECTED;
			break;
		case COHORT__FAULT_FAIL:
			st = COHORT_EINJECTED;
			break;
		}
	}
	if (st != COHORT_OK)
		return (cohort__err(st, "%s", text));
	return (COHORT_OK);
}

/* Adds a resolved plan's rules for this rank; under f->mtx. */
static void
fault_add_locked(struct cohort__fault *f,
    const struct cohort__fault_plan *plan, unsigned schedule)
{
	uint64_t ops = atomic_load(&f->ops);
	cohort__time now = cohort__now_ms();
	char rb[256];

	for (size_t i = 0; i < plan->n; i++) {
		const struct cohort__fault_rule *r = &plan->rules[i];
		struct fault_live *l;

		if (r->rank != COHORT__FAULT_RANK_ALL && r->rank != f->m.rank)
			continue;
		if (r->run != COHORT__FAULT_RUN_ANY && r->run != f->restart) {
			cohort__debug(
			    "fault rule %zu skipped: run=%d, this is "
			    "restart %d",
			    i + 1, r->run, f->restart);
			continue;
		}
		if (f->nlive == FAULT_MAX_LIVE) {
			cohort__warn("fault schedule: more than %d rules; "
			             "the rest is ignored",
			    FAULT_MAX_LIVE);
			return;
		}
		l = &f->live[f->nlive++];
		memset(l, 0, sizeof(*l));
		l->r = *r;
		l->seed = plan->seed;
		l->schedule = schedule;
		l->idx = (unsigned)i + 1;
		l->left = r->count;
		if (r->trigger == COHORT__FAULT_AT_OP)
			l->op_at = r->relative ? ops + r->at
			                       : (r->at > 0 ? r->at : 1);
		else
			l->time_at = (r->relative ? now : f->t0)
			    + (cohort__time)r->at;
		atomic_fetch_add(&f->pending, 1);
		cohort__fault_format_rule(r, rb, sizeof(rb));
		cohort__info("fault schedule %u (seed %" PRIu64 "): rank %d "
		             "will %s at %s %" PRIu64 "%s (%s)",
		    schedule, plan->seed, f->m.rank,
		    cohort__fault_action_name(r->action),
		    r->trigger == COHORT__FAULT_AT_OP ? "op" : "time",
		    r->trigger == COHORT__FAULT_AT_OP
		        ? l->op_at
		        : (uint64_t)(l->time_at - f->t0),
		    r->trigger == COHORT__FAULT_AT_OP ? "" : " ms", rb);
	}
	fault_arm_timer_locked(f);
}

static void
fault_timer_cb(void *arg)
{
	struct cohort__fault *f = arg;
	cohort__time now = cohort__now_ms();
	struct fault_live due[8];
	size_t ndue = 0;
	uint64_t n = atomic_load(&f->ops);
	char text[256];

	if (nng_aio_result(f->timer) != 0
	    && nng_aio_result(f->timer) != NNG_ETIMEDOUT)
		return;
	pthread_mutex_lock(&f->mtx);
	if (f->stopping) {
		pthread_mutex_unlock(&f->mtx);
		return;
	}
	for (size_t i = 0; i < f->nlive && ndue < 8; i++) {
		struct fault_live *l = &f->live[i];

		if (l->done || l->armed
		    || l->r.trigger != COHORT__FAULT_AT_TIME
		    || l->time_at > now)
			continue;
		if (l->r.action == COHORT__FAULT_DELAY
		    || l->r.action == COHORT__FAULT_FAIL) {
			l->armed = true; /* the next operation takes it */
			continue;
		}
		l->done = true;
		atomic_fetch_sub(&f->pending, 1);
		due[ndue++] = *l;
	}
	fault_arm_timer_locked(f);
	pthread_mutex_unlock(&f->mtx);

	for (size_t i = 0; i < ndue; i++) {
		struct fault_live *l = &due[i];

		size_t off = 0;

		fault_audit(f, l, n, NULL, NULL, 0);
		cohort__appendf(text, sizeof(text), &off,
		    "injected fault: %s at %" PRId64 " ms (seed=%" PRIu64
		    ", schedule %u rule %u)",
		    cohort__fault_action_name(l->r.action),
		    (int64_t)(l->time_at - f->t0), l->seed, l->schedule,
		    l->idx);
		switch (l->r.action) {
		case COHORT__FAULT_KILL:
			fault_do_signal(SIGKILL);
			break;
		case COHORT__FAULT_STOP:
			fault_do_signal(SIGSTOP);
			break;
		case COHORT__FAULT_EXIT:
			fault_spawn(f, l->r.action, (int)l->r.arg, text);
			break;
		case COHORT__FAULT_DROP:
			fault_spawn(f, l->r.action, 0, text);
			break;
		default:
			break;
		}
	}
}

/* Arms the timer for the earliest time trigger not yet due; f->mtx. */
static void
fault_arm_timer_locked(struct cohort__fault *f)
{
	cohort__time next = COHORT__TIME_NEVER, now = cohort__now_ms();

	if (f->timer == NULL || f->stopping)
		return;
	for (size_t i = 0; i < f->nlive; i++) {
		const struct fault_live *l = &f->live[i];

		if (!l->done && !l->armed
		    && l->r.trigger == COHORT__FAULT_AT_TIME
		    && l->time_at < next)
			next = l->time_at;
	}
	if (next == COHORT__TIME_NEVER)
		return;
	nng_aio_cancel(f->timer);
	nng_sleep_aio(next > now ? (nng_duration)(next - now) : 0, f->timer);
}

cohort_status
cohort__fault_add(struct cohort__fault *f, const char *spec, uint64_t salt)
{
	struct cohort__fault_plan *plan;
	cohort_status st;

	if (f == NULL)
		return (cohort__err(COHORT_ESTATE, "no fault state"));
	if ((plan = malloc(sizeof(*plan))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	if ((st = cohort__fault_parse(spec, plan)) != COHORT_OK
	    || (st = cohort__fault_resolve(plan,
	            fault_mix(f->m.job_id ^ fault_mix(salt)), f->m.world))
	        != COHORT_OK) {
		free(plan);
		return (st);
	}
	pthread_mutex_lock(&f->mtx);
	fault_add_locked(f, plan, (unsigned)salt);
	pthread_mutex_unlock(&f->mtx);
	free(plan);
	return (COHORT_OK);
}

/* `cohort fault` delivery: a KV get of __cohort/faults/N that waits for
 * it at cohortd, at most FAULT_POLL_MS; the heartbeat starts it again
 * when it is not running. */
#define FAULT_POLL_MS 60000
static void fault_poll_start(struct cohort__fault *f, bool from_tick);

/* A stored schedule is "generation=G\n<spec>": only for that generation. */
static void
fault_poll_apply(
    struct cohort__fault *f, const uint8_t *val, size_t len, uint64_t n)
{
	char buf[4096];
	const char *nl;
	int64_t gen;
	cohort_status st;

	if (len >= sizeof(buf)) {
		cohort__warn("fault schedule #%" PRIu64 " is too long", n);
		return;
	}
	memcpy(buf, val, len);
	buf[len] = '\0';
	if (strncmp(buf, "generation=", 11) != 0
	    || (nl = strchr(buf, '\n')) == NULL) {
		cohort__warn("fault schedule #%" PRIu64 " is malformed", n);
		return;
	}
	buf[nl - buf] = '\0';
	if (!cohort__parse_i64(buf + 11, &gen)
	    || (uint64_t)gen != f->m.generation) {
		cohort__debug("fault schedule #%" PRIu64 " is for generation "
		              "%s, not %" PRIu64,
		    n, buf + 11, f->m.generation);
		return;
	}
	if ((st = cohort__fault_add(f, nl + 1, n)) != COHORT_OK)
		cohort__warn("fault schedule #%" PRIu64 " refused: %s", n,
		    cohort_last_error());
	else
		cohort__info(
		    "fault schedule #%" PRIu64 " received: %s", n, nl + 1);
}

static void
fault_poll_done(void *arg, cohort_status st, struct cohort__coord_call *call)
{
	struct cohort__fault *f = arg;
	const Cohort__Reply *rep = call->rep;

	pthread_mutex_lock(&f->mtx);
	if (f->stopping) {
		pthread_mutex_unlock(&f->mtx);
		return;
	}
	pthread_mutex_unlock(&f->mtx);
	/* Found: apply it and look for the next one at once; otherwise
	 * (the wait timed out, the connection changed) the next heartbeat
	 * looks again. */
	if (st == COHORT_OK && rep->body_case == COHORT__REPLY__BODY_KV_GET
	    && rep->kv_get != NULL && rep->kv_get->found) {
		fault_poll_apply(f, call->payload, call->plen, f->poll_next);
		f->poll_next++;
		/* on nng's thread, which never waits for the engine's lock
		 * (busy: the next heartbeat starts it) */
		fault_poll_start(f, true);
	}
}

static void
fault_poll_start(struct cohort__fault *f, bool from_tick)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvGet get = COHORT__KV_GET__INIT;
	char key[64];
	cohort_status st;

	snprintf(key, sizeof(key), COHORT__FAULT_KEY_PREFIX "%" PRIu64,
	    f->poll_next);
	get.key = key;
	/* A long poll, parked at cohortd until the key appears (answered
	 * at once then) or FAULT_POLL_MS passed (the next heartbeat asks
	 * again): no request per heartbeat per client, which at thousands
	 * of clients was as many requests as the heartbeats themselves. */
	get.wait = true;
	req.body_case = COHORT__REQUEST__BODY_KV_GET;
	req.kv_get = &get;
	if (from_tick) {
		bool busy;

		/* the heartbeat thread: never waits for the engine's lock
		 * (busy: a later heartbeat starts it) */
		st = cohort__coord_async_try_start(
		    f->poll, &req, cohort__now_ms() + FAULT_POLL_MS, &busy);
	} else {
		st = cohort__coord_async_start(
		    f->poll, &req, cohort__now_ms() + FAULT_POLL_MS);
	}
	if (st != COHORT_OK && st != COHORT_ECLOSED && st != COHORT_ESTATE)
		cohort__debug("fault poll stopped: %s: %s",
		    cohort_status_name(st), cohort_last_error());
}

void
cohort__fault_tick(struct cohort__fault *f)
{
	bool stopping;

	if (f == NULL || f->poll == NULL)
		return;
	cohort__coord_async_tick(f->poll, cohort__now_ms());
	/* busy: the next heartbeat looks again */
	if (pthread_mutex_trylock(&f->mtx) != 0)
		return;
	stopping = f->stopping;
	pthread_mutex_unlock(&f->mtx);
	if (!stopping)
		fault_poll_start(f, true);
}

cohort_status
cohort__fault_open(
    const struct cohort__fault_hooks *hooks, struct cohort__fault **out)
{
	struct cohort__fault *f;
	const char *spec = cohort__knob_str(COHORT__KNOB_FAULTS);
	const char *log = cohort__knob_str(COHORT__KNOB_FAULTS_LOG);
	const char *rs = cohort__knob_str(COHORT__KNOB_RESTART_COUNT);
	int64_t v;
	cohort_status st;

	if ((f = calloc(1, sizeof(*f))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	if (pthread_mutex_init(&f->mtx, NULL) != 0) {
		free(f);
		return (cohort__err(COHORT_ESYSTEM, "pthread_mutex_init"));
	}
	f->hooks = *hooks;
	f->poll_next = 1;
	atomic_init(&f->ops, 0);
	atomic_init(&f->pending, 0);
	if (rs != NULL && cohort__parse_i64(rs, &v) && v >= 0 && v < INT32_MAX)
		f->restart = (int32_t)v;
	if (log != NULL)
		cohort__strlcpy(f->log_path, log, sizeof(f->log_path));
	if (spec != NULL && spec[0] != '\0') {
		if ((st = cohort__fault_parse(spec, &f->env)) != COHORT_OK) {
			char detail[512];

			cohort__strlcpy(
			    detail, cohort_last_error(), sizeof(detail));
			pthread_mutex_destroy(&f->mtx);
			free(f);
			return (cohort__err(st, "COHORT_FAULTS: %s", detail));
		}
		f->have_env = f->env.n > 0;
	}
	*out = f;
	return (COHORT_OK);
}

cohort_status
cohort__fault_start(
    struct cohort__fault *f, const struct cohort__fault_member *m)
{
	char text[2048];
	cohort_status st;
	int rv;

	if (f == NULL)
		return (COHORT_OK);
	f->m = *m;
	cohort__strlcpy(f->job, m->job, sizeof(f->job));
	f->m.job = f->job;
	f->t0 = cohort__now_ms();
	if ((rv = nng_aio_alloc(&f->timer, fault_timer_cb, f)) != 0)
		return (cohort__err(cohort__from_nng(rv), "nng_aio_alloc: %s",
		    nng_strerror(rv)));
	if (f->have_env) {
		if ((st = cohort__fault_resolve(
		         &f->env, fault_mix(f->m.job_id), f->m.world))
		    != COHORT_OK)
			return (st);
		cohort__fault_format(&f->env, text, sizeof(text));
		if (f->m.rank == 0 || cohort__log_enabled(COHORT__LOG_INFO))
			fprintf(stderr,
			    "cohort fault: rank %d: schedule %s (restart %d)"
			    "\n",
			    f->m.rank, text, f->restart);
		pthread_mutex_lock(&f->mtx);
		fault_add_locked(f, &f->env, 0);
		pthread_mutex_unlock(&f->mtx);
	}
	if (cohort__knob_int_or(COHORT__KNOB_FAULTS_LISTEN, 1) == 0)
		return (COHORT_OK);
	if ((st = cohort__coord_async_alloc(
	         f->m.coord, fault_poll_done, f, &f->poll))
	    != COHORT_OK)
		return (st);
	fault_poll_start(f, false);
	return (COHORT_OK);
}

void
cohort__fault_stop(struct cohort__fault *f)
{
	if (f == NULL)
		return;
	pthread_mutex_lock(&f->mtx);
	f->stopping = true;
	pthread_mutex_unlock(&f->mtx);
	if (f->timer != NULL)
		nng_aio_stop(f->timer);

	if (f->poll != NULL)
		cohort__coord_async_stop(f->poll);
}

void
cohort__fault_close(struct cohort__fault **fp)
{
	struct cohort__fault *f = *fp;

	if (f == NULL)
		return;
	*fp = NULL;
	cohort__fault_stop(f);
	if (f->timer != NULL)
		nng_aio_free(f->timer);
	cohort__coord_async_free(f->poll);
	pthread_mutex_destroy(&f->mtx);
	free(f);
}
