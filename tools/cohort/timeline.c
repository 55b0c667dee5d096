/*
 * timeline.c - `cohort run --timeline PATH`: the workers write their
 * Chrome traces (COHORT_TIMELINE, client/observe.c) into PATH.parts/, one
 * file per rank and generation; at the end the launcher merges them into
 * PATH, adds its own row (restarts, the failure it reported) and removes
 * the parts (docs/observability.md).
 *
 * A worker's file holds one event per line between the line
 * `{"traceEvents":[` and the line starting with `],`, sorted by track and
 * time; files are merged in (rank, generation) order, so every track stays
 * sorted by time.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "timeline.h"

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

int
cohort__timeline_merge(const char *path, int world,
    const struct cohort__timeline_mark *marks, int nmarks)
{
	char dir[1100], file[1400], tmp[1100];
	struct tl_part *parts = NULL;
	size_t np = 0, cap = 0, nev = 0;
	struct dirent *de;
	char *line = NULL;
	size_t linecap = 0;
	bool first = true;
	DIR *d;
	FILE *out;

	snprintf(dir, sizeof(dir), "%s.parts", path);
	if ((d = opendir(dir)) == NULL) {
		fprintf(stderr, "cohort run: --timeline: %s: %s\n", dir,
		    strerror(errno));
		return (-1);
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
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if ((out = fopen(tmp, "w")) == NULL) {
		fprintf(stderr,
		    "cohort run: --timeline: cannot write %s: %s\n", tmp,
		    strerror(errno));
		free(parts);
		return (-1);
	}
	fprintf(out, "{\"traceEvents\":[\n");
	for (size_t i = 0; i < np; i++) {
		FILE *in;
		bool in_events = false;
		ssize_t n;

		snprintf(file, sizeof(file), "%s/%s", dir, parts[i].name);
		if ((in = fopen(file, "r")) == NULL)
			continue;
		while ((n = getline(&line, &linecap, in)) > 0) {
			while (n > 0
			    && (line[n - 1] == '\n' || line[n - 1] == ','))
				line[--n] = '\0';
			if (!in_events) {
				in_events
				    = strcmp(line, "{\"traceEvents\":[") == 0;
				continue;
			}
			if (line[0] == ']')
				break;
			if (n == 0)
				continue;
			fprintf(out, "%s%s", first ? "" : ",\n", line);
			first = false;
			nev++;
		}
		fclose(in);
		(void)unlink(file);
	}
	/* The launcher's own row: restarts and the failure it reported. */
	fprintf(out,
	    "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
	    "\"args\":{\"name\":\"cohort run (launcher)\"}},\n"
	    "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
	    "\"tid\":0,\"args\":{\"sort_index\":%d}},\n"
	    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,"
	    "\"args\":{\"name\":\"events\"}}",
	    first ? "" : ",\n", world, world, world, world);
	for (int i = 0; i < nmarks; i++) {
		fprintf(out,
		    ",\n{\"name\":\"%s\",\"cat\":\"launcher\",\"ph\":\"i\","
		    "\"s\":\"g\",\"pid\":%d,\"tid\":1,\"ts\":%" PRIu64
		    ",\"args\":{\"detail\":",
		    marks[i].name, world, marks[i].ts_us);
		cohort__json_str(out, marks[i].detail);
		fprintf(out, "}}");
	}
	fprintf(out,
	    "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"world_size\":%d,"
	    "\"files\":%zu,\"events\":%zu}}\n",
	    world, np, nev);
	free(line);
	free(parts);
	if (fclose(out) != 0 || rename(tmp, path) != 0) {
		fprintf(stderr,
		    "cohort run: --timeline: cannot write %s: %s\n", path,
		    strerror(errno));
		return (-1);
	}
	(void)rmdir(dir);
	fprintf(stderr,
	    "cohort run: timeline of %zu events from %zu files in %s\n", nev,
	    np, path);
	return (0);
}
