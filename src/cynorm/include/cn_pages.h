/* The huge-page size that cn_alloc maps outputs on and that threads split
 * page population at (cn_populate_share): one definition for both. */
#ifndef CN_PAGES_H
#define CN_PAGES_H

#include <stddef.h>

#define CN_HUGE_PAGE ((size_t)2 << 20)

#endif
