/*
 * timeline.h - merging the workers' timelines (`cohort run --timeline`,
 * timeline.c).
 */
#ifndef COHORT_TOOLS_TIMELINE_H
#define COHORT_TOOLS_TIMELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* An instant of the launcher's own row (a restart, a failure). */
struct cohort__timeline_mark {
	const char *name; /* static */
	uint64_t ts_us; /* cohort__timeline_now_us */
	char detail[512];
};

/* Creates PATH.parts and writes the workers' COHORT_TIMELINE=... into
 * env. 0, or -1 with a message on stderr. */
int cohort__timeline_prepare(const char *path, char *env, size_t len);
/* Merges PATH.parts/rank*.gen*.json and the marks into PATH (the
 * launcher's row is pid `world`), then removes the parts. */
int cohort__timeline_merge(const char *path, int world,
    const struct cohort__timeline_mark *marks, int nmarks);
/* s as a quoted JSON string (the report of cohort run, the marks). */
void cohort__json_str(FILE *f, const char *s);
/* Realtime microseconds, the timelines' clock. */
uint64_t cohort__timeline_now_us(void);

#endif /* COHORT_TOOLS_TIMELINE_H */
