/*
 * metrics.h - the /metrics text (metrics.c).
 */
#ifndef COHORT_SRV_METRICS_H
#define COHORT_SRV_METRICS_H

#include "core/core.h"

/* Prometheus text (for /metrics) into a malloc'd string; NULL when out
 * of memory. */
char *srv_metrics_text(struct srv_core *core, cohort__time now);

#endif /* COHORT_SRV_METRICS_H */
