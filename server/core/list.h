/*
 * list.h - intrusive doubly linked lists (the link lives in the object)
 * and SRV_CONTAINER, which finds the object from its link or map node.
 */
#ifndef COHORT_SRV_LIST_H
#define COHORT_SRV_LIST_H

#include <stdbool.h>
#include <stddef.h>

#define SRV_CONTAINER(p, T, f) ((T *)(void *)((char *)(p)-offsetof(T, f)))

/* A list head or a member's link; an unlinked link points to itself. */
struct srv_link {
	struct srv_link *next;
	struct srv_link *prev;
};

static inline void
srv_list_init(struct srv_link *h)
{
	h->next = h->prev = h;
}

static inline bool
srv_list_empty(const struct srv_link *h)
{
	return (h->next == h);
}

static inline void
srv_list_append(struct srv_link *h, struct srv_link *l)
{
	l->prev = h->prev;
	l->next = h;
	h->prev->next = l;
	h->prev = l;
}

/* Unlinks l (which then points to itself again). */
static inline void
srv_list_remove(struct srv_link *l)
{
	l->prev->next = l->next;
	l->next->prev = l->prev;
	l->next = l->prev = l;
}

#endif /* COHORT_SRV_LIST_H */
