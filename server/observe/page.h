/*
 * page.h - the live status page (page.c): one static HTML document that
 * polls /status.json.
 */
#ifndef COHORT_SRV_PAGE_H
#define COHORT_SRV_PAGE_H

extern const char srv_status_page[];

#endif /* COHORT_SRV_PAGE_H */
