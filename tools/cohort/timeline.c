/*
 * timeline.c - one Chrome trace for the whole job (docs/observability.md).
 *
 * The workers write their traces (COHORT_TIMELINE, client/observe.c)
 * into PATH.parts/, one file per rank and generation. At the end each
 * launcher turns its node's into a share: every event of its workers, one
 * JSON object a line, files in (rank, generation) order so that each
 * track stays sorted by time, then its own row (restarts, the failure it
 * reported) as process world + node_rank. Ranks are the workers' process
 * ids in the trace and unique in the job; the launchers' rows come after
 * them, one per node.
 *
 * Several nodes: the launchers meet in a job of their own at the
 * coordinator ("JOB.timeline", rank = node rank, one client each, the
 * job's token), nodes 1.. store their shares in its key-value store
 * (TL_CHUNK bytes a key, then the count: "node1.0", "node1.1",
 * "node1.n"), node 0 reads them and writes PATH, and a barrier tells the
 * others that it has. A node that cannot take part keeps its share as its
 * own PATH; `cohort timeline merge OUT IN...` joins such files.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cohort_impl.h"
#include "timeline.h"

int cohort__cmd_timeline(int argc, char **argv);

#define TL_CHUNK ((size_t)8 << 20) /* under cohortd's 64 MiB values */
#define TL_MAX_SHARE ((size_t)1 << 30) /* larger: kept on its node */

/* A node's share: event lines, each ending in '\n'. */
struct tl_share {
	char *p;
	size_t len, cap;
	size_t files, events;
	bool oom;
};

struct tl_part {
	char name[256];
	long rank, gen;
};

int
cohort__timeline_prepare(const char *path, char *env, size_t len)
{
	char dir[1100];

	snprintf(dir, sizeof(dir), "%s.parts", path);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr,
		    "cohort run: --timeline: cannot create %s: %s\n", dir,
		    strerror(errno));
		return (-1);
	}
	if ((size_t)snprintf(
	        env, len, "COHORT_TIMELINE=%s/rank%%r.gen%%g.json", dir)
	    >= len) {
		fprintf(stderr, "cohort run: --timeline: path too long\n");
		return (-1);
	}
	return (0);
}

static int
tl_part_cmp(const void *a, const void *b)
{
	const struct tl_part *x = a, *y = b;

	if (x->rank != y->rank)
		return (x->rank < y->rank ? -1 : 1);
	return (x->gen < y->gen ? -1 : x->gen > y->gen ? 1 : 0);
}

void
cohort__json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

uint64_t
cohort__timeline_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ((uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000);
}

static void
tl_reserve(struct tl_share *s, size_t more)
{
	size_t cap = s->cap ? s->cap : 65536;
	char *np;

	if (s->oom || s->len + more + 1 <= s->cap)
		return;
	while (cap < s->len + more + 1)
		cap *= 2;
	if ((np = realloc(s->p, cap)) == NULL) {
		s->oom = true;
		return;
	}
	s->p = np;
	s->cap = cap;
}

static void
tl_add(struct tl_share *s, const char *data, size_t n)
{
	tl_reserve(s, n);
	if (s->oom)
		return;
	memcpy(s->p + s->len, data, n);
	s->len += n;
	s->p[s->len] = '\0';
}

static void __attribute__((format(printf, 2, 3)))
tl_addf(struct tl_share *s, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	tl_reserve(s, (size_t)n);
	if (s->oom)
		return;
	va_start(ap, fmt);
	vsnprintf(s->p + s->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	s->len += (size_t)n;
}

/* Appends the events of one trace file (between its `{"traceEvents":[`
 * line and the line starting with `]`). False when it cannot be read. */
static bool
tl_add_file(struct tl_share *s, const char *file)
{
	FILE *in = fopen(file, "r");
	char *line = NULL;
	size_t linecap = 0;
	bool in_events = false;
	ssize_t n;

	if (in == NULL)
		return (false);
	while ((n = getline(&line, &linecap, in)) > 0) {
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == ','))
			line[--n] = '\0';
		if (!in_events) {
			in_events = strcmp(line, "{\"traceEvents\":[") == 0;
			continue;
		}
		if (line[0] == ']')
			break;
		if (n == 0)
			continue;
		line[n] = '\n';
		tl_add(s, line, (size_t)n + 1);
		s->events++;
	}
	free(line);
	fclose(in);
	s->files++;
	return (true);
}

/* This node's workers' traces into s, in (rank, generation) order; the
 * parts and their folder are removed. */
static int
tl_collect(const char *path, struct tl_share *s)
{
	char dir[1100], file[1400];
	struct tl_part *parts = NULL;
	size_t np = 0, cap = 0;
	struct dirent *de;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s.parts", path);
	if ((d = opendir(dir)) == NULL) {
		/* no worker wrote one: the launcher's row is still worth it */
		fprintf(stderr, "cohort run: --timeline: %s: %s\n", dir,
		    strerror(errno));
		return (0);
	}
	while ((de = readdir(d)) != NULL) {
		struct tl_part p;

		if (sscanf(de->d_name, "rank%ld.gen%ld.json", &p.rank, &p.gen)
		        != 2
		    || strlen(de->d_name) >= sizeof(p.name)
		    || strstr(de->d_name, ".tmp") != NULL)
			continue;
		snprintf(p.name, sizeof(p.name), "%s", de->d_name);
		if (np == cap) {
			size_t nc = cap ? cap * 2 : 16;
			struct tl_part *n = realloc(parts, nc * sizeof(*n));
			if (n == NULL)
				break;
			parts = n;
			cap = nc;
		}
		parts[np++] = p;
	}
	closedir(d);
	if (np > 0)
		qsort(parts, np, sizeof(*parts), tl_part_cmp);
	for (size_t i = 0; i < np; i++) {
		snprintf(file, sizeof(file), "%s/%s", dir, parts[i].name);
		if (tl_add_file(s, file))
			(void)unlink(file);
	}
	free(parts);
	(void)rmdir(dir);
	return (0);
}

/* The launcher's row of node (process world + node) with its marks. */
static void
tl_launcher_row(struct tl_share *s, const struct cohort__timeline_job *tj,
    const struct cohort__timeline_mark *marks, int nmarks)
{
	int pid = tj->world + tj->node_rank;
	char name[64];

	if (tj->nnodes > 1)
		snprintf(name, sizeof(name), "cohort run (launcher, node %d)",
		    tj->node_rank);
	else
		snprintf(name, sizeof(name), "cohort run (launcher)");
	tl_addf(s,
	    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
	    "\"args\":{\"name\":\"%s\"}}\n"
	    "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
	    "\"tid\":0,\"args\":{\"sort_index\":%d}}\n"
	    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,"
	    "\"args\":{\"name\":\"events\"}}\n",
	    pid, name, pid, pid, pid);
	for (int i = 0; i < nmarks; i++) {
		char *buf = NULL;
		size_t blen = 0;
		FILE *m = open_memstream(&buf, &blen);

		if (m == NULL)
			continue;
		cohort__json_str(m, marks[i].detail);
		fclose(m);
		tl_addf(s,
		    "{\"name\":\"%s\",\"cat\":\"launcher\",\"ph\":\"i\","
		    "\"s\":\"g\",\"pid\":%d,\"tid\":1,\"ts\":%" PRIu64
		    ",\"args\":{\"detail\":%s}}\n",
		    marks[i].name, pid, marks[i].ts_us, buf);
		free(buf);
	}
}

/* Writes path (atomically) from the shares; missing: the nodes whose
 * share is not in it ("" if none). */
static int
tl_write(const char *who, const char *path, int world, int nnodes,
    struct tl_share *const *sh, int nsh, const char *missing)
{
	char tmp[1100];
	size_t files = 0, events = 0;
	bool first = true;
	FILE *out;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if ((out = fopen(tmp, "w")) == NULL) {
		fprintf(stderr, "%s: timeline: cannot write %s: %s\n", who,
		    tmp, strerror(errno));
		return (-1);
	}
	fprintf(out, "{\"traceEvents\":[\n");
	for (int i = 0; i < nsh; i++) {
		const char *p = sh[i] != NULL ? sh[i]->p : NULL;
		const char *nl;

		if (p == NULL)
			continue;
		files += sh[i]->files;
		events += sh[i]->events;
		for (; (nl = strchr(p, '\n')) != NULL; p = nl + 1) {
			if (nl == p)
				continue;
			fprintf(out, "%s%.*s", first ? "" : ",\n",
			    (int)(nl - p), p);
			first = false;
		}
	}
	fprintf(out,
	    "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"world_size\":%d,"
	    "\"nodes\":%d,\"files\":%zu,\"events\":%zu,\"missing_nodes\":[%s]"
	    "}}\n",
	    world, nnodes, files, events, missing);
	if (fclose(out) != 0 || rename(tmp, path) != 0) {
		fprintf(stderr, "%s: timeline: cannot write %s: %s\n", who,
		    path, strerror(errno));
		return (-1);
	}
	fprintf(stderr,
	    "%s: timeline of %zu events from %zu files%s%s in %s\n", who,
	    events, files, missing[0] ? "; missing the shares of nodes " : "",
	    missing, path);
	return (0);
}

/* Node > 0: the share into the launchers' job, then the barrier that
 * says node 0 has written the file. */
static cohort_status
tl_send(cohort_client *c, int node, const struct tl_share *s, int wait_ms)
{
	char key[64], n[32];
	size_t k = 0;
	cohort_status st = COHORT_OK;

	for (size_t off = 0; st == COHORT_OK && (off < s->len || k == 0);
	     off += TL_CHUNK, k++) {
		size_t len = s->len - off < TL_CHUNK ? s->len - off : TL_CHUNK;
		snprintf(key, sizeof(key), "node%d.%zu", node, k);
		st = cohort_kv_set(
		    c, key, s->p != NULL ? s->p + off : "", len, wait_ms);
	}
	snprintf(key, sizeof(key), "node%d.n", node);
	snprintf(n, sizeof(n), "%zu %zu %zu", k, s->files, s->events);
	if (st == COHORT_OK)
		st = cohort_kv_set(c, key, n, strlen(n), wait_ms);
	if (st == COHORT_OK)
		st = cohort_barrier(
		    cohort_client_world(c), "written", wait_ms);
	return (st);
}

/* Node 0: node's share out of the launchers' job, by the deadline. */
static cohort_status
tl_receive(cohort_client *c, int node, struct tl_share *s, int64_t deadline)
{
	char key[64], head[64];
	size_t k = 0;
	void *v = NULL;
	size_t len = 0;
	cohort_status st;

	snprintf(key, sizeof(key), "node%d.n", node);
	st = cohort_kv_get(c, key, &v, &len,
	    (cohort_duration)(deadline > cohort__now_ms()
	            ? deadline - cohort__now_ms()
	            : 1));
	if (st != COHORT_OK)
		return (st);
	snprintf(head, sizeof(head), "%.*s",
	    (int)(len < sizeof(head) - 1 ? len : sizeof(head) - 1),
	    (const char *)v);
	cohort_free(v);
	if (sscanf(head, "%zu %zu %zu", &k, &s->files, &s->events) != 3)
		return (cohort__err(COHORT_EPROTO, "bad %s: '%s'", key, head));
	for (size_t i = 0; i < k && st == COHORT_OK; i++) {
		snprintf(key, sizeof(key), "node%d.%zu", node, i);
		if ((st = cohort_kv_get(c, key, &v, &len, 5000))
		    == COHORT_OK) {
			tl_add(s, v, len);
			cohort_free(v);
		}
	}
	return (s->oom ? COHORT_ENOMEM : st);
}

/* Several nodes: the launchers' job. 0 when node 0 wrote the file. */
static int
tl_gather(const struct cohort__timeline_job *tj, struct tl_share *mine)
{
	char job[300], missing[256] = "", why[512] = "";
	struct tl_share **sh;
	cohort_options o;
	cohort_client *c = NULL;
	cohort_status st;
	int rc = -1;

	snprintf(job, sizeof(job), "%s.timeline", tj->job);
	cohort_options_init(&o);
	o.coordinator = tj->url;
	o.job = job;
	o.token = tj->token;
	o.rank = tj->node_rank;
	o.world_size = tj->nnodes;
	o.op_timeout = tj->wait_ms;
	o.join_timeout = tj->wait_ms;
	o.backend = "service"; /* no data plane: KV and a barrier */
	if ((st = cohort_client_open(&o, &c, tj->wait_ms)) != COHORT_OK) {
		snprintf(why, sizeof(why), "%s: %s", cohort_status_name(st),
		    cohort_last_error());
		goto out;
	}
	if (tj->node_rank > 0) {
		if (mine->oom || mine->len > TL_MAX_SHARE)
			st = cohort__err(
			    COHORT_ETOOBIG, "share of %zu bytes", mine->len);
		else
			st = tl_send(c, tj->node_rank, mine, tj->wait_ms);
		if (st == COHORT_OK) {
			fprintf(stderr,
			    "cohort run: timeline: node %d's %zu events are "
			    "in node 0's %s\n",
			    tj->node_rank, mine->events, tj->path);
			rc = 0;
		} else {
			snprintf(why, sizeof(why), "%s: %s",
			    cohort_status_name(st), cohort_last_error());
		}
		goto out;
	}
	if ((sh = calloc((size_t)tj->nnodes, sizeof(*sh))) == NULL)
		goto out;
	sh[0] = mine;
	{
		int64_t deadline = cohort__now_ms() + tj->wait_ms;
		size_t off = 0;

		for (int n = 1; n < tj->nnodes; n++) {
			if ((sh[n] = calloc(1, sizeof(**sh))) == NULL
			    || tl_receive(c, n, sh[n], deadline)
			        != COHORT_OK) {
				cohort__appendf(missing, sizeof(missing), &off,
				    "%s%d", off ? "," : "", n);
				if (sh[n] != NULL)
					free(sh[n]->p);
				free(sh[n]);
				sh[n] = NULL;
			}
		}
	}
	rc = tl_write("cohort run", tj->path, tj->world, tj->nnodes, sh,
	    tj->nnodes, missing);
	/* the others wait for this before they leave */
	(void)cohort_barrier(cohort_client_world(c), "written", tj->wait_ms);
	for (int n = 1; n < tj->nnodes; n++)
		if (sh[n] != NULL) {
			free(sh[n]->p);
			free(sh[n]);
		}
	free(sh);
	rc = rc == 0 ? 0 : -1;
out:
	cohort_client_close(c);
	if (rc != 0 && why[0] != '\0')
		fprintf(stderr,
		    "cohort run: --timeline: node %d could not meet the "
		    "other nodes' launchers at %s (job '%s'): %s\n",
		    tj->node_rank, tj->url, job, why);
	return (rc);
}

int
cohort__timeline_finish(const struct cohort__timeline_job *tj,
    const struct cohort__timeline_mark *marks, int nmarks)
{
	struct tl_share mine, *one[1] = { &mine };
	char missing[256] = "";
	int rc;

	memset(&mine, 0, sizeof(mine));
	if (tl_collect(tj->path, &mine) != 0)
		return (-1);
	tl_launcher_row(&mine, tj, marks, nmarks);
	if (tj->nnodes > 1 && tl_gather(tj, &mine) == 0) {
		free(mine.p);
		return (0);
	}
	if (tj->nnodes > 1) {
		/* only this node's share: say so in the file too */
		size_t off = 0;
		for (int n = 0; n < tj->nnodes; n++)
			if (n != tj->node_rank)
				cohort__appendf(missing, sizeof(missing), &off,
				    "%s%d", off ? "," : "", n);
		fprintf(stderr,
		    "cohort run: --timeline: %s holds node %d's share only; "
		    "`cohort timeline merge OUT FILE...` joins the nodes' "
		    "files\n",
		    tj->path, tj->node_rank);
	}
	rc = tl_write(
	    "cohort run", tj->path, tj->world, tj->nnodes, one, 1, missing);
	free(mine.p);
	return (rc);
}

/* ------------------------------------------------------------------------ */
/* cohort timeline merge OUT IN...                                          */
/* ------------------------------------------------------------------------ */

static void
tl_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohort timeline merge OUT IN...\n"
	    "\n"
	    "Joins Chrome traces of one job (the --timeline files of cohort "
	    "run's\n"
	    "nodes, when they could not be gathered on node 0) into OUT.\n");
}

/* world_size of a trace's otherData, 0 if absent. */
static int
tl_world_of(const char *file)
{
	FILE *in = fopen(file, "r");
	char *line = NULL, *w;
	size_t cap = 0;
	int world = 0;

	if (in == NULL)
		return (0);
	while (getline(&line, &cap, in) > 0)
		if ((w = strstr(line, "\"world_size\":")) != NULL)
			world = (int)strtol(w + 13, NULL, 10);
	free(line);
	fclose(in);
	return (world);
}

int
cohort__cmd_timeline(int argc, char **argv)
{
	struct tl_share **sh;
	int world = 0, rc, n = argc - 3;

	if (argc >= 2
	    && (strcmp(argv[1], "--help") == 0
	        || strcmp(argv[1], "-h") == 0)) {
		tl_usage(stdout);
		return (0);
	}
	if (argc < 4 || strcmp(argv[1], "merge") != 0) {
		tl_usage(stderr);
		return (2);
	}
	if ((sh = calloc((size_t)n, sizeof(*sh))) == NULL)
		return (1);
	for (int i = 0; i < n; i++) {
		const char *in = argv[3 + i];
		int w;

		if ((sh[i] = calloc(1, sizeof(**sh))) == NULL
		    || !tl_add_file(sh[i], in)) {
			fprintf(stderr,
			    "cohort timeline: cannot read %s: %s\n", in,
			    strerror(errno));
			rc = 1;
			goto out;
		}
		sh[i]->files = 1;
		if ((w = tl_world_of(in)) > world)
			world = w;
	}
	rc = tl_write("cohort timeline", argv[2], world, n, sh, n, "") == 0
	    ? 0
	    : 1;
out:
	for (int i = 0; i < n; i++)
		if (sh[i] != NULL) {
			free(sh[i]->p);
			free(sh[i]);
		}
	free(sh);
	return (rc);
}
